// Randomized property test of PlacementCore: many random events, checked
// after each against invariants and against a naive reference that applies
// the policy of placement.h by brute force.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/core/placement.h"

namespace dlbatch::scheduler {
namespace {

constexpr JobId kFree = -1;

using Caps = std::map<WorkerId, int>;
using Counts = std::vector<std::pair<WorkerId, int>>;

// Best fit on one worker (least capacity, then lowest id); else the fewest
// workers by capacity (highest, then highest id), the last by best fit.
std::optional<Counts> NaivePlace(const Caps& caps, int pool, int max_nodes) {
  auto best_fit = [&](int need, const std::set<WorkerId>& skip) {
    std::optional<std::pair<int, WorkerId>> best;
    for (const auto& [w, cap] : caps) {
      if (cap >= need && !skip.count(w) &&
          (!best || std::pair(cap, w) < *best)) {
        best = std::pair(cap, w);
      }
    }
    return best;
  };
  if (auto one = best_fit(pool, {})) return Counts{{one->second, pool}};
  if (max_nodes <= 1) return std::nullopt;
  std::vector<std::pair<int, WorkerId>> sorted;
  for (const auto& [w, cap] : caps) {
    if (cap > 0) sorted.emplace_back(cap, w);
  }
  std::sort(sorted.rbegin(), sorted.rend());
  int sum = 0;
  size_t k = 0;
  while (k < sorted.size() && static_cast<int>(k) < max_nodes && sum < pool) {
    sum += sorted[k++].first;
  }
  if (sum < pool) return std::nullopt;
  Counts counts;
  std::set<WorkerId> used;
  int rest = pool;
  for (size_t i = 0; i + 1 < k; ++i) {
    counts.emplace_back(sorted[i].second, sorted[i].first);
    used.insert(sorted[i].second);
    rest -= sorted[i].first;
  }
  counts.emplace_back(best_fit(rest, used)->second, rest);
  return counts;
}

class NaiveScheduler {
 public:
  struct Worker {
    std::string profile;
    int slots = 0;
    bool online = false;
    std::vector<JobId> owner;
  };
  struct Running {
    QueuedJob job;
    std::vector<Part> parts;
    TimeMs start = 0;
    TimeMs end = kNever;
  };

  void AddProfile(const std::string& name) {
    if (std::find(profiles_.begin(), profiles_.end(), name) == profiles_.end())
      profiles_.push_back(name);
  }
  void WorkerOnline(WorkerId id, const std::string& profile, int slots) {
    AddProfile(profile);
    Worker& w = workers_[id];
    w.profile = profile;
    w.slots = slots;
    w.online = true;
    if (static_cast<int>(w.owner.size()) < slots) w.owner.resize(slots, kFree);
  }
  void WorkerOffline(WorkerId id) {
    if (workers_.count(id)) workers_[id].online = false;
  }
  std::vector<JobId> WorkerLost(WorkerId id) {
    std::vector<JobId> lost;
    if (!workers_.count(id)) return lost;
    for (const auto& [job, r] : running_) {
      for (const Part& p : r.parts) {
        if (p.worker == id) {
          lost.push_back(job);
          break;
        }
      }
    }
    for (JobId job : lost) Finished(job, last_now_);
    workers_[id].online = false;
    return lost;
  }
  void SetLimit(const std::string& user, const std::string& profile,
                const UserLimit& limit) {
    limits_[{user, profile}] = limit;
  }
  void Charge(const std::string& user, double slot_ms) {
    charged_[user] += slot_ms;
  }
  void Forget(WorkerId id) {
    WorkerLost(id);
    workers_.erase(id);
    only_.erase(id);
  }
  // The worker runs only these users' jobs; nullopt: anyone's.
  void SetUsers(WorkerId id, std::optional<std::set<std::string>> users) {
    if (users) {
      only_[id] = *std::move(users);
    } else {
      only_.erase(id);
    }
  }
  bool Runs(WorkerId id, const std::string& user) const {
    auto it = only_.find(id);
    return it == only_.end() || it->second.count(user) != 0;
  }
  // `caps` without the workers that do not run `user`'s jobs.
  Caps Able(Caps caps, const std::string& user) const {
    for (auto it = caps.begin(); it != caps.end();) {
      it = Runs(it->first, user) ? std::next(it) : caps.erase(it);
    }
    return caps;
  }
  void Enqueue(const QueuedJob& job) {
    AddProfile(job.profile);
    queued_[job.id] = job;
  }
  bool Dequeue(JobId id) { return queued_.erase(id) != 0; }
  void MarkRunning(const QueuedJob& job, const std::vector<Part>& parts,
                   TimeMs start) {
    AddProfile(job.profile);
    for (const Part& p : parts) {
      Worker& w = workers_.at(p.worker);
      for (int d : p.devices) {
        if (d >= static_cast<int>(w.owner.size())) w.owner.resize(d + 1, kFree);
        if (w.owner[d] == kFree) w.owner[d] = job.id;
      }
    }
    Add(job, parts, start);
  }
  bool Finished(JobId id, TimeMs end) {
    auto it = running_.find(id);
    if (it == running_.end()) return false;
    const Running& r = it->second;
    charged_[r.job.user] +=
        static_cast<double>(r.job.pool) * (std::max(end, r.start) - r.start);
    for (const Part& p : it->second.parts) {
      auto w = workers_.find(p.worker);
      if (w == workers_.end()) continue;
      for (int d : p.devices) {
        if (d < static_cast<int>(w->second.owner.size()) &&
            w->second.owner[d] == id) {
          w->second.owner[d] = kFree;
        }
      }
    }
    running_.erase(it);
    return true;
  }

  // Each profile's first waiting job in the last pass.
  struct Head {
    JobId job = 0;
    std::string user;
    std::string profile;
    int pool = 0;
    bool started_ahead = false;  // a job ordered before it started
  };
  std::vector<Head> heads_;
  const std::vector<std::string>& profiles() const { return profiles_; }

  std::vector<Decision> Schedule(TimeMs now) {
    last_now_ = now;
    heads_.clear();
    std::vector<Decision> out;
    for (const std::string& profile : profiles_) {
      // As the core: passes repeat while one starts a job. The profile's
      // head is the last pass's, counted as started ahead of if any pass
      // had another head or started a job ahead of it.
      std::vector<Head> seen;
      for (int i = 0; i < kMaxPassesPerSchedule; ++i) {
        const size_t heads_before = heads_.size();
        const size_t before = out.size();
        Pass(profile, now, out);
        seen.insert(seen.end(), heads_.begin() + heads_before, heads_.end());
        heads_.resize(heads_before);
        if (out.size() == before) break;
      }
      if (seen.empty()) continue;
      Head last = seen.back();
      for (const Head& h : seen) {
        if (h.job != last.job || h.started_ahead) last.started_ahead = true;
      }
      heads_.push_back(last);
    }
    return out;
  }

  int Free(const Worker& w) const {
    int free = 0;
    for (int d = 0; d < w.slots; ++d) free += w.owner[d] == kFree;
    return free;
  }

  // Undecayed slot-ms of the user's ended and running jobs, and charges.
  double Usage(const std::string& user, TimeMs now) const {
    auto c = charged_.find(user);
    double usage = c == charged_.end() ? 0 : c->second;
    for (const auto& [id, r] : running_) {
      if (r.job.user == user) {
        usage += static_cast<double>(r.job.pool) * (now - r.start);
      }
    }
    return usage;
  }

  int Held(const std::string& user, const std::string& profile) const {
    int held = 0;
    for (const auto& [id, r] : running_) {
      if (r.job.user == user && r.job.profile == profile) held += r.job.pool;
    }
    return held;
  }

  // Slots the user may still take on the profile; INT_MAX if unlimited.
  int Room(const std::string& user, const std::string& profile) const {
    auto it = limits_.find({user, profile});
    if (it == limits_.end() || it->second.max_slots < 0) {
      return std::numeric_limits<int>::max();
    }
    return it->second.max_slots - Held(user, profile);
  }

  std::map<WorkerId, Worker> workers_;
  std::map<JobId, QueuedJob> queued_;
  std::map<JobId, Running> running_;
  std::map<std::pair<std::string, std::string>, UserLimit> limits_;
  std::map<WorkerId, std::set<std::string>> only_;

 private:
  void Add(const QueuedJob& job, const std::vector<Part>& parts, TimeMs t) {
    Running& r = running_[job.id];
    r.job = job;
    r.start = t;
    r.parts = parts;
    r.end = job.time_limit_ms > 0 ? t + job.time_limit_ms : kNever;
  }

  Caps FreeCaps(const std::string& profile) const {
    Caps caps;
    for (const auto& [id, w] : workers_) {
      if (w.online && w.profile == profile) caps[id] = Free(w);
    }
    return caps;
  }

  void Pass(const std::string& profile, TimeMs now,
            std::vector<Decision>& out) {
    std::vector<QueuedJob> queue;
    for (const auto& [id, job] : queued_) {
      if (job.profile == profile) queue.push_back(job);
    }
    // Priority, then the user's usage, then submission order.
    std::map<std::string, double> usage;
    for (const QueuedJob& job : queue) usage[job.user] = Usage(job.user, now);
    std::sort(queue.begin(), queue.end(),
              [&](const QueuedJob& a, const QueuedJob& b) {
                if (a.priority != b.priority) return a.priority > b.priority;
                if (usage[a.user] != usage[b.user]) {
                  return usage[a.user] < usage[b.user];
                }
                if (a.seq != b.seq) return a.seq < b.seq;
                return a.id < b.id;
              });
    const size_t started_before = out.size();
    bool reserved = false;
    TimeMs start = kNever;
    Caps slack;
    std::string head_user;
    int head_pool = 0;
    for (const QueuedJob& job : queue) {
      Caps free = Able(FreeCaps(profile), job.user);
      if (!reserved) {
        if (job.pool > Room(job.user, profile)) continue;
        if (auto counts = NaivePlace(free, job.pool, job.max_nodes)) {
          Start(job, *counts, now, out);
          continue;
        }
        Caps all;
        for (const auto& [id, w] : workers_) {
          if (w.online && w.profile == profile && Runs(id, job.user)) {
            all[id] = w.slots;
          }
        }
        if (!NaivePlace(all, job.pool, job.max_nodes)) continue;
        reserved = true;
        head_user = job.user;
        head_pool = job.pool;
        heads_.push_back(
            {job.id, job.user, profile, job.pool, out.size() > started_before});
        // The earliest end after which the job fits.
        std::vector<std::pair<TimeMs, JobId>> ends;
        for (const auto& [id, r] : running_) {
          if (r.job.profile == profile && r.end != kNever) {
            ends.emplace_back(r.end, id);
          }
        }
        std::sort(ends.begin(), ends.end());
        Caps at = free;
        std::optional<Counts> counts;
        for (size_t i = 0; i < ends.size() && !counts;) {
          const TimeMs t = ends[i].first;
          for (; i < ends.size() && ends[i].first == t; ++i) {
            const Running& r = running_.at(ends[i].second);
            for (const Part& p : r.parts) {
              auto w = workers_.find(p.worker);
              if (w == workers_.end() || !w->second.online ||
                  w->second.profile != profile || !Runs(p.worker, job.user)) {
                continue;
              }
              for (int d : p.devices) {
                if (d < w->second.slots && w->second.owner[d] == r.job.id) {
                  ++at[p.worker];
                }
              }
            }
          }
          counts = NaivePlace(at, job.pool, job.max_nodes);
          start = std::max(t, now);
        }
        if (!counts) {
          at = all;
          counts = NaivePlace(all, job.pool, job.max_nodes);
          start = kNever;
        }
        for (const auto& [w, n] : *counts) {
          slack[w] = at[w] - n;
          if (start != kNever) continue;
          // Slots of jobs without a limit are never slack.
          const Worker& worker = workers_.at(w);
          for (int d = 0; d < worker.slots; ++d) {
            const JobId owner = worker.owner[d];
            slack[w] -= owner != kFree && running_.at(owner).end == kNever;
          }
          slack[w] = std::max(0, slack[w]);
        }
        continue;
      }
      const bool ends_first =
          job.time_limit_ms > 0 && now + job.time_limit_ms <= start;
      // A job of the head's user leaves it room under the user's limit.
      const int keep = job.user == head_user ? head_pool : 0;
      if (job.pool + keep > Room(job.user, profile)) continue;
      Caps usable = free;
      if (!ends_first) {
        for (const auto& [w, s] : slack) {
          if (usable.count(w)) usable[w] = std::min(usable[w], s);
        }
      }
      if (auto counts = NaivePlace(usable, job.pool, job.max_nodes)) {
        Start(job, *counts, now, out);
        if (!ends_first) {
          for (const auto& [w, n] : *counts) {
            if (slack.count(w)) slack[w] -= n;
          }
        }
      }
    }
  }

  void Start(const QueuedJob& job, const Counts& counts, TimeMs now,
             std::vector<Decision>& out) {
    Decision d{job.id, {}};
    for (const auto& [id, n] : counts) {
      Worker& w = workers_.at(id);
      Part part{id, {}};
      for (int dev = 0;
           dev < w.slots && static_cast<int>(part.devices.size()) < n; ++dev) {
        if (w.owner[dev] == kFree) {
          w.owner[dev] = job.id;
          part.devices.push_back(dev);
        }
      }
      d.parts.push_back(part);
    }
    queued_.erase(job.id);
    Add(job, d.parts, now);
    out.push_back(d);
  }

  std::vector<std::string> profiles_;
  std::map<std::string, double> charged_;
  TimeMs last_now_ = 0;
};

std::string Describe(const std::vector<Decision>& decisions) {
  std::string s;
  for (const Decision& d : decisions) {
    s += "job " + std::to_string(d.job) + ":";
    for (const Part& p : d.parts) {
      s += " w" + std::to_string(p.worker) + "[";
      for (int dev : p.devices) s += std::to_string(dev) + ",";
      s += "]";
    }
    s += "\n";
  }
  return s;
}

class RandomEvents {
 public:
  // With `users`: jobs of four users, random limits and usage charges, no
  // decay (so that usage is exact and the reference agrees to the bit).
  // worker_users: workers run only some users' jobs, at random.
  explicit RandomEvents(int seed, bool users = false, bool worker_users = false)
      : rng_(seed), users_(users), worker_users_(worker_users) {
    for (const char* p : {"a", "b"}) {
      core_.AddProfile(p, 0);
      naive_.AddProfile(p);
    }
    if (users_) core_.SetFairShareHalfLife(0);
  }

  std::string User() {
    return users_ ? "u" + std::to_string(Uniform(0, 3)) : "";
  }

  // Limits and charges; true if it did one.
  bool UserStep() {
    const int dice = Uniform(0, 99);
    if (dice < 4) {
      const std::string user = User();
      const std::string profile = Uniform(0, 1) ? "a" : "b";
      UserLimit limit;
      if (Uniform(0, 2)) limit.max_slots = Uniform(0, 8);
      core_.SetLimit(user, profile, limit);
      naive_.SetLimit(user, profile, limit);
      EXPECT_EQ(core_.GetLimit(user, profile), limit);
      return true;
    }
    if (dice < 6) {
      const std::string user = User();
      const double slot_ms = Uniform(1, 500);
      core_.ChargeUsage(user, slot_ms, now_);
      naive_.Charge(user, slot_ms);
      return true;
    }
    if (worker_users_ && dice < 9) {
      const WorkerId w = Uniform(1, 8);
      const int kind = Uniform(0, 2);
      if (kind == 0) {
        core_.SetWorkerUsers(w, WorkerUsers{});
        naive_.SetUsers(w, std::nullopt);
        return true;
      }
      std::set<std::string> users = {User()};
      if (kind == 2) users.insert(User());
      WorkerUsers wu;
      wu.anyone = false;
      // Answers one at a time, or closed to the named users at once.
      if (Uniform(0, 1)) {
        wu.closed = true;
        wu.can = users;
        core_.SetWorkerUsers(w, wu);
      } else {
        core_.SetWorkerUsers(w, wu);
        for (int u = 0; u < 4; ++u) {
          const std::string name = "u" + std::to_string(u);
          core_.SetWorkerUser(w, name, users.count(name) != 0);
        }
      }
      naive_.SetUsers(w, users);
      return true;
    }
    return false;
  }

  int Uniform(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

  // Mostly short, sometimes long enough to fall in coarse limit buckets.
  TimeMs Limit() { return Uniform(0, 3) ? Uniform(1, 120) : Uniform(1, 20000); }

  void Step() {
    if (users_ && UserStep()) {
      CheckInvariants();
      return;
    }
    const int dice = Uniform(0, 99);
    if (dice < 12) {
      const WorkerId w = Uniform(1, 8);
      const std::string profile = w % 2 ? "a" : "b";
      const int slots = Uniform(1, 6);
      core_.WorkerOnline(w, profile, slots);
      naive_.WorkerOnline(w, profile, slots);
    } else if (dice < 17) {
      const WorkerId w = Uniform(1, 8);
      core_.WorkerOffline(w);
      naive_.WorkerOffline(w);
    } else if (dice < 20) {
      const WorkerId w = Uniform(1, 8);
      std::vector<JobId> lost = core_.WorkerLost(w);
      EXPECT_EQ(lost, naive_.WorkerLost(w));
    } else if (dice < 21) {
      const WorkerId w = Uniform(1, 8);
      core_.ForgetWorker(w);
      naive_.Forget(w);
    } else if (dice < 50) {
      QueuedJob job;
      job.id = next_id_++;
      job.seq = job.id;
      job.profile = Uniform(0, 1) ? "a" : "b";
      job.pool = Uniform(1, 6);
      job.priority = Uniform(0, 3);
      job.max_nodes = Uniform(0, 1) ? 1 : Uniform(2, 3);
      job.time_limit_ms = Uniform(0, 2) ? Limit() : 0;
      job.user = User();
      core_.Enqueue(job);
      naive_.Enqueue(job);
    } else if (dice < 55) {
      if (naive_.queued_.empty()) return;
      auto it = naive_.queued_.begin();
      std::advance(it, Uniform(0, naive_.queued_.size() - 1));
      const JobId id = it->first;
      EXPECT_TRUE(core_.Dequeue(id));
      naive_.Dequeue(id);
    } else if (dice < 80) {
      if (naive_.running_.empty()) return;
      auto it = naive_.running_.begin();
      std::advance(it, Uniform(0, naive_.running_.size() - 1));
      const JobId id = it->first;
      if (users_ && Uniform(0, 1)) {
        const TimeMs end = now_ - Uniform(0, 10);
        EXPECT_TRUE(core_.Finished(id, end));
        naive_.Finished(id, end);
      } else {
        EXPECT_TRUE(core_.Finished(id));
        naive_.Finished(id, last_now_);
      }
    } else if (dice < 83) {
      // A job reported by a worker: some of its free devices.
      const WorkerId w = Uniform(1, 8);
      auto it = naive_.workers_.find(w);
      if (it == naive_.workers_.end()) return;
      std::vector<int> devices;
      for (int d : core_.FreeDevices(w)) {
        if (Uniform(0, 1)) devices.push_back(d);
      }
      if (devices.empty()) return;
      QueuedJob job;
      job.id = next_id_++;
      job.seq = job.id;
      job.profile = it->second.profile;
      job.pool = static_cast<int>(devices.size());
      job.time_limit_ms = Uniform(0, 1) ? Limit() : 0;
      job.user = User();
      const TimeMs start = now_ - Uniform(0, 50);
      core_.MarkRunning(job, {Part{w, devices}}, start);
      naive_.MarkRunning(job, {Part{w, devices}}, start);
    } else {
      now_ += Uniform(0, 30);
      Schedule();
    }
    CheckInvariants();
  }

  void Schedule() {
    last_now_ = now_;
    // The job holding each profile's reservation, and when.
    std::map<JobId, TimeMs> heads = Heads();
    std::vector<Decision> got = core_.Schedule(now_);
    std::vector<Decision> want = naive_.Schedule(now_);
    ASSERT_EQ(Describe(got), Describe(want)) << "at t=" << now_;
    for (const Decision& d : got) CheckDecision(d);
    {
      std::vector<Decision> again = core_.Schedule(now_);
      if (!again.empty()) {
        std::vector<Decision> naive_again = naive_.Schedule(now_);
        ADD_FAILURE() << "a pass is a fixed point; first:\n"
                      << Describe(got) << "second (core):\n"
                      << Describe(again) << "second (naive):\n"
                      << Describe(naive_again);
      }
    }
    // The job that would preempt is each profile's head of the last pass,
    // the reference's passes going on past the last free slot.
    for (const std::string& profile : naive_.profiles()) {
      std::optional<JobId> head;
      for (const NaiveScheduler::Head& h : naive_.heads_) {
        if (h.profile == profile) head = h.job;
      }
      EXPECT_EQ(core_.FirstBlocked(profile), head)
          << "profile " << profile << " at t=" << now_;
    }
    // Backfill never moves a waiting head's reservation later. With users,
    // fair share may reorder the queue between passes: the guarantee is for
    // the job first in this pass's order, if no job moved ahead of it.
    std::set<JobId> pass_heads;
    for (const NaiveScheduler::Head& h : naive_.heads_) {
      if (!h.started_ahead) pass_heads.insert(h.job);
    }
    for (const auto& [job, promised] : Heads()) {
      auto before = heads.find(job);
      if (users_ && !pass_heads.count(job)) continue;
      if (before != heads.end()) {
        EXPECT_LE(promised, std::max(before->second, now_)) << "job " << job;
      }
    }
    // Nor takes the room a waiting head needs under its user's limit (else
    // it would lose its reservation to the next pass's limit check).
    for (const NaiveScheduler::Head& h : naive_.heads_) {
      if (!naive_.queued_.count(h.job)) continue;
      const int room = naive_.Room(h.user, h.profile);
      if (room == std::numeric_limits<int>::max()) continue;
      EXPECT_LE(h.pool, room) << "head " << h.job << " of " << h.user;
      std::optional<WaitInfo> info = core_.Explain(h.job);
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->user_slots, naive_.Held(h.user, h.profile));
    }
    // No pass takes a user past their limit.
    for (const Decision& d : got) {
      const QueuedJob& job = naive_.running_.at(d.job).job;
      EXPECT_GE(naive_.Room(job.user, job.profile), 0) << "job " << d.job;
    }
  }

  void CheckDecision(const Decision& d) {
    const QueuedJob& job = naive_.running_.at(d.job).job;
    int devices = 0;
    std::set<WorkerId> workers;
    for (const Part& p : d.parts) {
      const auto& w = naive_.workers_.at(p.worker);
      EXPECT_TRUE(w.online);
      EXPECT_EQ(w.profile, job.profile);
      EXPECT_TRUE(workers.insert(p.worker).second);
      for (int dev : p.devices) EXPECT_LT(dev, w.slots);
      devices += static_cast<int>(p.devices.size());
    }
    EXPECT_EQ(devices, job.pool);
    EXPECT_LE(static_cast<int>(d.parts.size()), job.max_nodes);
  }

  void CheckInvariants() {
    // No device held twice: each running job's recorded devices.
    std::map<std::pair<WorkerId, int>, JobId> held;
    for (const auto& [id, r] : naive_.running_) {
      for (const Part& p : r.parts) {
        const auto& w = naive_.workers_.at(p.worker);
        for (int d : p.devices) {
          if (w.owner[d] != id) continue;  // claimed by another first
          EXPECT_TRUE(held.emplace(std::pair(p.worker, d), id).second);
        }
      }
    }
    std::map<std::string, int> free_slots;
    for (const auto& [id, w] : naive_.workers_) {
      std::vector<int> free;
      for (int d = 0; d < w.slots; ++d) {
        if (!held.count({id, d})) free.push_back(d);
      }
      EXPECT_EQ(core_.FreeDevices(id), free) << "worker " << id;
      if (w.online) free_slots[w.profile] += static_cast<int>(free.size());
    }
    EXPECT_EQ(core_.queued_count(), naive_.queued_.size());
    EXPECT_EQ(core_.running_count(), naive_.running_.size());
    for (const auto& [id, job] : naive_.queued_) {
      EXPECT_TRUE(core_.IsQueued(id));
      EXPECT_FALSE(core_.IsRunning(id));
    }
    for (const auto& [id, r] : naive_.running_)
      EXPECT_TRUE(core_.IsRunning(id));
    int queued = 0, running = 0;
    for (const ProfileSummary& p : core_.Profiles()) {
      EXPECT_EQ(p.free_slots, free_slots[p.name]) << p.name;
      queued += p.queued;
      running += p.running;
    }
    EXPECT_EQ(queued, static_cast<int>(naive_.queued_.size()));
    EXPECT_EQ(running, static_cast<int>(naive_.running_.size()));
  }

  std::map<JobId, TimeMs> Heads() {
    std::map<JobId, TimeMs> heads;
    for (const auto& [id, job] : naive_.queued_) {
      std::optional<WaitInfo> info = core_.Explain(id);
      EXPECT_TRUE(info.has_value());
      if (info && info->reserved) heads[id] = info->reserved_start;
    }
    return heads;
  }

 private:
  std::mt19937 rng_;
  bool users_ = false;
  bool worker_users_ = false;
  PlacementCore core_;
  NaiveScheduler naive_;
  JobId next_id_ = 1;
  TimeMs now_ = 1000;
  TimeMs last_now_ = 0;
};

// Seeds 1 to 40 (DLBATCH_PLACEMENT_SEEDS=N: 1 to N, a longer soak), and the
// seeds that once found a bug: 351 and 483 found passes that were not fixed
// points (a job held back by the head's reservation fitted once the pass's
// own starts had moved that reservation).
std::vector<int> Seeds() {
  const char* env = std::getenv("DLBATCH_PLACEMENT_SEEDS");
  int n = env != nullptr ? std::atoi(env) : 0;
  if (n <= 0) n = 40;
  std::vector<int> seeds;
  for (int seed = 1; seed <= n; ++seed) seeds.push_back(seed);
  for (int seed : {351, 483}) {
    if (seed > n) seeds.push_back(seed);
  }
  return seeds;
}

TEST(PlacementRandom, MatchesNaiveReferenceAndKeepsInvariants) {
  for (int seed : Seeds()) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomEvents events(seed);
    for (int step = 0; step < 600; ++step) {
      events.Step();
      if (::testing::Test::HasFatalFailure() ||
          ::testing::Test::HasNonfatalFailure()) {
        FAIL() << "at step " << step;
      }
    }
  }
}

// The same with several users under random limits and fair share: the
// order, the limits and the backfill guarantee (the head's slots and its
// user's room) hold against the reference.
TEST(PlacementRandom, UsersLimitsAndFairShareMatchReference) {
  for (int seed : Seeds()) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomEvents events(seed, /*users=*/true);
    for (int step = 0; step < 600; ++step) {
      events.Step();
      if (::testing::Test::HasFatalFailure() ||
          ::testing::Test::HasNonfatalFailure()) {
        FAIL() << "at step " << step;
      }
    }
  }
}

// The same with workers that run only some users' jobs (a worker not
// started as root, or one whose machine lacks accounts): decisions, the
// backfill guarantee and the limits hold against the reference, which
// leaves such workers out for the other users.
TEST(PlacementRandom, WorkersOfSomeUsersMatchReference) {
  for (int seed : Seeds()) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomEvents events(seed, /*users=*/true, /*worker_users=*/true);
    for (int step = 0; step < 600; ++step) {
      events.Step();
      if (::testing::Test::HasFatalFailure() ||
          ::testing::Test::HasNonfatalFailure()) {
        FAIL() << "at step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace dlbatch::scheduler
