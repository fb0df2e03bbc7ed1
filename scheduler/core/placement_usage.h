// Fair-share usage of the scheduling core: per user, the slot-time of their
// jobs, each moment weighted by 2^-(age / half-life) (Slurm's decayed usage).
//
// Pure: time comes in as arguments. Values are kept in "epoch units": a
// slot-ms used at time t counts w(t) = 2^((t - epoch) / half_life), so that
// decay changes no stored value and users compare by their stored values
// alone; the decayed usage at `now` is value / w(now). The epoch moves
// forward (every value rescaled by the same factor) before w grows large.
// With a half-life of 0 there is no decay: w = 1 and values are plain
// slot-ms, exact in a double up to 2^53.
#ifndef DLBATCH_SCHEDULER_CORE_PLACEMENT_USAGE_H_
#define DLBATCH_SCHEDULER_CORE_PLACEMENT_USAGE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dlbatch::scheduler {

inline constexpr int64_t kDefaultHalfLifeMs = 7LL * 24 * 3600 * 1000;

class UsageLedger {
 public:
  struct User {
    std::string name;
    double charged = 0;   // ended usage and charges, in epoch units
    int64_t running = 0;  // slots of running jobs
    double starts = 0;    // sum over running jobs of slots * F(start)
  };

  // The half-life; 0: no decay. REQUIRES: nothing recorded yet.
  void SetHalfLife(int64_t half_life_ms);
  int64_t half_life() const { return half_life_; }

  // The user's entry, created empty if new; the address stays put.
  User& Get(const std::string& name);
  const User* Find(const std::string& name) const;

  // A job holding `slots` started at `start` / ended at `end` (>= start).
  void Started(User& u, int slots, int64_t start);
  void Ended(User& u, int slots, int64_t start, int64_t end);
  // Adds `slot_ms` of usage as of `at`.
  void Charge(User& u, double slot_ms, int64_t at);

  // The user's usage up to `now` in epoch units: users compare by it at the
  // same `now`; larger is more usage.
  double Standing(const User& u, int64_t now) const;
  // Standing as decayed slot-ms at `now`.
  double Decayed(const User& u, int64_t now) const;
  // The usage of ended jobs and charges alone (running jobs left out), as
  // decayed slot-ms at `at`: what Charge(u, it, at) restores.
  double Ended(const User& u, int64_t at) const;

  // Moves the epoch to `now` if weights have grown past 2^8 (decay only).
  void Rebase(int64_t now);

  const std::unordered_map<std::string, User>& users() const { return users_; }

 private:
  // Sets the epoch at the first time seen.
  void Touch(int64_t t);
  // The integral of w from the epoch to t (decay: h/ln2 * w(t); else t-epoch).
  double F(int64_t t) const;
  double W(int64_t t) const;

  int64_t half_life_ = kDefaultHalfLifeMs;
  bool has_epoch_ = false;
  int64_t epoch_ = 0;
  std::unordered_map<std::string, User> users_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_PLACEMENT_USAGE_H_
