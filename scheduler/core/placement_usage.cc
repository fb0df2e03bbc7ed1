#include "scheduler/core/placement_usage.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dlbatch::scheduler {

void UsageLedger::SetHalfLife(int64_t half_life_ms) {
  half_life_ = std::max<int64_t>(0, half_life_ms);
}

UsageLedger::User& UsageLedger::Get(const std::string& name) {
  auto [it, added] = users_.try_emplace(name);
  if (added) it->second.name = name;
  return it->second;
}

const UsageLedger::User* UsageLedger::Find(const std::string& name) const {
  auto it = users_.find(name);
  return it == users_.end() ? nullptr : &it->second;
}

void UsageLedger::Touch(int64_t t) {
  if (has_epoch_) return;
  has_epoch_ = true;
  epoch_ = t;
}

double UsageLedger::W(int64_t t) const {
  if (half_life_ == 0) return 1;
  return std::exp2(static_cast<double>(t - epoch_) /
                   static_cast<double>(half_life_));
}

double UsageLedger::F(int64_t t) const {
  if (half_life_ == 0) return static_cast<double>(t - epoch_);
  return static_cast<double>(half_life_) / std::numbers::ln2 * W(t);
}

void UsageLedger::Started(User& u, int slots, int64_t start) {
  Touch(start);
  u.running += slots;
  u.starts += slots * F(start);
}

void UsageLedger::Ended(User& u, int slots, int64_t start, int64_t end) {
  Touch(start);
  end = std::max(end, start);
  u.charged += slots * (F(end) - F(start));
  u.running -= slots;
  // Rounding must not leave a trace once nothing runs.
  u.starts = u.running == 0 ? 0 : u.starts - slots * F(start);
}

void UsageLedger::Charge(User& u, double slot_ms, int64_t at) {
  Touch(at);
  u.charged += std::max(0.0, slot_ms) * W(at);
}

double UsageLedger::Standing(const User& u, int64_t now) const {
  if (u.running == 0) return u.charged;
  return u.charged + std::max(0.0, u.running * F(now) - u.starts);
}

double UsageLedger::Decayed(const User& u, int64_t now) const {
  const double s = Standing(u, now);
  return s == 0 ? 0 : s / W(now);
}

double UsageLedger::Ended(const User& u, int64_t at) const {
  return u.charged == 0 ? 0 : u.charged / W(at);
}

void UsageLedger::Rebase(int64_t now) {
  Touch(now);
  if (half_life_ == 0 || now - epoch_ <= 8 * half_life_) return;
  const double factor = 1 / W(now);
  for (auto& [name, u] : users_) {
    u.charged *= factor;
    u.starts *= factor;
  }
  epoch_ = now;
}

}  // namespace dlbatch::scheduler
