#include "scheduler/core/placement.h"

#include <algorithm>
#include <bit>
#include <compare>
#include <deque>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/core/placement_usage.h"

namespace dlbatch::scheduler {
namespace {

constexpr JobId kNoJob = std::numeric_limits<JobId>::min();

// Queue order: higher priority first, then older submission.
struct QueueKey {
  int priority = 0;
  int64_t seq = 0;
  JobId id = 0;
  TimeMs limit = 0;  // the job's time limit, at hand for backfill; no order

  bool operator<(const QueueKey& o) const {
    if (priority != o.priority) return priority > o.priority;
    if (seq != o.seq) return seq < o.seq;
    return id < o.id;
  }
};

QueueKey KeyOf(const QueuedJob& job) {
  return {job.priority, job.seq, job.id, job.time_limit_ms};
}

// What bounds where a queued job can go. Pools ascend within `multi`, and
// limits within a pool, so that a pass skips larger pools, or a pool's
// longer limits, at once (see Verdict).
struct Shape {
  bool multi = false;
  int pool = 0;
  int limit_bucket = 0;  // see LimitBucket
  auto operator<=>(const Shape&) const = default;
};

// Whether a walk takes the jobs of a shape, and what else it may skip.
enum class Verdict {
  kTake,
  kSkip,       // not this shape
  kNextPool,   // nor any longer limit of this pool
  kNextMulti,  // nor any larger pool
};

// Time limits are bucketed so that a pass can rule out whole groups of jobs
// whose limit is too long to end before a reservation: bucket 0 is "no
// limit", 1..31 are exact limits, and longer limits fall into 16 buckets per
// power of two (each spans at most 1/16 of its lower bound).
constexpr int kFirstOctave = 5;
constexpr int kExactLimits = 1 << kFirstOctave;
constexpr int kSubBits = 4;

int LimitBucket(TimeMs limit) {
  if (limit <= 0) return 0;
  if (limit < kExactLimits) return static_cast<int>(limit);
  const int octave =
      static_cast<int>(std::bit_width(static_cast<uint64_t>(limit))) - 1;
  const int sub =
      static_cast<int>(limit >> (octave - kSubBits)) & ((1 << kSubBits) - 1);
  return kExactLimits + (octave - kFirstOctave) * (1 << kSubBits) + sub;
}

// The shortest limit in `bucket`. REQUIRES: bucket > 0.
TimeMs BucketMinLimit(int bucket) {
  if (bucket < kExactLimits) return bucket;
  const int octave = (bucket - kExactLimits) / (1 << kSubBits) + kFirstOctave;
  const int sub = (bucket - kExactLimits) % (1 << kSubBits);
  return (TimeMs{(1 << kSubBits) + sub}) << (octave - kSubBits);
}

Shape ShapeOf(const QueuedJob& job) {
  return {job.max_nodes > 1, job.pool, LimitBucket(job.time_limit_ms)};
}

// a + b, saturating at kNever. REQUIRES: b >= 0.
TimeMs AddSat(TimeMs a, TimeMs b) {
  if (a > 0 && b > kNever - a) return kNever;
  return a + b;
}

std::string Plural(int64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// (capacity, worker) of the workers a placement may use; capacity > 0.
using CapSet = std::set<std::pair<int, WorkerId>>;
// Per-worker capacities that replace those of a CapSet.
using Overrides = std::unordered_map<WorkerId, int>;
// Slots to take per worker, in the order chosen.
using Counts = std::vector<std::pair<WorkerId, int>>;

// The capacity of every worker: `base`, except where `overrides` says
// otherwise. Workers in neither have capacity 0.
// Workers in `barred` (sorted; null: none) are left out whatever their
// capacity: they do not run the job's user.
bool Excluded(const std::vector<WorkerId>& sorted_exclude, WorkerId w) {
  return std::binary_search(sorted_exclude.begin(), sorted_exclude.end(), w);
}

struct View {
  const CapSet* base = nullptr;
  const Overrides* overrides = nullptr;
  const std::vector<WorkerId>* barred = nullptr;

  bool Overridden(WorkerId w) const {
    return overrides != nullptr && overrides->count(w) != 0;
  }
  bool Barred(WorkerId w) const {
    return barred != nullptr && Excluded(*barred, w);
  }
};

// The worker with the least capacity >= need (ties: lower id), skipping
// `sorted_exclude`.
std::optional<std::pair<int, WorkerId>> BestFit(
    const View& view, int need, const std::vector<WorkerId>& sorted_exclude) {
  std::optional<std::pair<int, WorkerId>> best;
  for (auto it =
           view.base->lower_bound({need, std::numeric_limits<WorkerId>::min()});
       it != view.base->end(); ++it) {
    if (view.Overridden(it->second) || view.Barred(it->second) ||
        Excluded(sorted_exclude, it->second)) {
      continue;
    }
    best = *it;
    break;
  }
  if (view.overrides != nullptr) {
    for (const auto& [worker, cap] : *view.overrides) {
      std::pair<int, WorkerId> candidate{cap, worker};
      if (cap >= need && !Excluded(sorted_exclude, worker) &&
          !view.Barred(worker) && (!best || candidate < *best)) {
        best = candidate;
      }
    }
  }
  return best;
}

// Calls f(capacity, worker) for workers with capacity > 0, largest first
// (ties: higher id first), until f returns false.
template <typename F>
void ForEachLargest(const View& view, F&& f) {
  std::vector<std::pair<int, WorkerId>> extra;
  if (view.overrides != nullptr) {
    for (const auto& [worker, cap] : *view.overrides) {
      if (cap > 0 && !view.Barred(worker)) extra.emplace_back(cap, worker);
    }
    std::sort(extra.rbegin(), extra.rend());
  }
  auto it = view.base->rbegin();
  size_t i = 0;
  while (true) {
    while (it != view.base->rend() &&
           (view.Overridden(it->second) || view.Barred(it->second))) {
      ++it;
    }
    const bool has_base = it != view.base->rend();
    const bool has_extra = i < extra.size();
    if (!has_base && !has_extra) return;
    std::pair<int, WorkerId> next;
    if (has_base && (!has_extra || *it > extra[i])) {
      next = *it++;
    } else {
      next = extra[i++];
    }
    if (!f(next.first, next.second)) return;
  }
}

// Where a job of `pool` slots spanning at most `max_nodes` workers goes in
// `view`: best fit on one worker; else the fewest workers, the most free
// first, the last of them chosen by best fit for the remainder.
std::optional<Counts> Place(const View& view, int pool, int max_nodes) {
  if (auto one = BestFit(view, pool, {})) return Counts{{one->second, pool}};
  if (max_nodes <= 1) return std::nullopt;
  std::vector<std::pair<int, WorkerId>> top;
  int64_t sum = 0;
  ForEachLargest(view, [&](int cap, WorkerId worker) {
    top.emplace_back(cap, worker);
    sum += cap;
    return sum < pool && static_cast<int>(top.size()) < max_nodes;
  });
  if (sum < pool) return std::nullopt;
  Counts counts;
  std::vector<WorkerId> used;
  int rest = pool;
  for (size_t i = 0; i + 1 < top.size(); ++i) {
    counts.emplace_back(top[i].second, top[i].first);
    used.push_back(top[i].second);
    rest -= top[i].first;
  }
  std::sort(used.begin(), used.end());
  // top.back() holds >= rest, so a last worker exists.
  auto last = BestFit(view, rest, used);
  counts.emplace_back(last->second, rest);
  return counts;
}

// One user on one profile: limits, running slots and queued jobs. All of a
// user's jobs share one usage, so QueueKey order is queue order within it.
struct Account {
  UsageLedger::User* user = nullptr;
  UserLimit limit;
  int64_t running_slots = 0;
  std::set<QueueKey> queue;
  std::map<Shape, std::set<QueueKey>> shapes;  // the queue, by shape
  std::map<int, int> pools;  // pool -> queued jobs of that pool
  double standing = 0;       // the user's usage, as of the current pass
  // The profile's workers that do not run this user's jobs, sorted, as of
  // the profile's users_gen barred_gen (see State::Barred).
  mutable std::vector<WorkerId> barred;
  mutable int64_t barred_gen = -1;

  int SmallestPool() const { return pools.empty() ? 0 : pools.begin()->first; }

  // Slots the user may still take here while keeping `reserve` free.
  int64_t Room(int64_t reserve = 0) const {
    if (limit.max_slots < 0) return std::numeric_limits<int64_t>::max();
    return limit.max_slots - running_slots - reserve;
  }
};

// Queue order across accounts: higher priority, then less usage, then older.
struct Order {
  int priority = 0;
  double standing = 0;
  int64_t seq = 0;
  JobId id = 0;

  bool operator<(const Order& o) const {
    if (priority != o.priority) return priority > o.priority;
    if (standing != o.standing) return standing < o.standing;
    if (seq != o.seq) return seq < o.seq;
    return id < o.id;
  }
};

Order OrderOf(const Account& a, const QueueKey& key) {
  return {key.priority, a.standing, key.seq, key.id};
}

struct Profile {
  std::string name;
  int max_pool = 0;
  int workers = 0;  // registered, online or not
  int workers_online = 0;
  int64_t known_slots = 0;
  int64_t online_slots = 0;
  int64_t free_slots = 0;  // on online workers
  std::multiset<int> known_sizes;
  CapSet online_caps;  // (slots, worker) of online workers
  CapSet free_caps;    // (free, worker) of online workers
  int64_t queued = 0;
  std::unordered_map<std::string, Account> accounts;  // by user
  int running = 0;
  std::set<std::pair<TimeMs, JobId>> ends;  // running jobs with a limit
  // Registered workers that do not run every user's jobs, and a count that
  // changes whenever this set or their users do.
  std::set<WorkerId> restricted;
  int64_t users_gen = 0;
  // The last pass's head (PlacementCore::FirstBlocked); `blocked_walk`: no
  // pass reached one, the profile being full, so it is looked for at a call.
  std::optional<JobId> first_blocked;
  bool blocked_walk = false;
};

struct Worker {
  WorkerId id = 0;
  Profile* profile = nullptr;
  int slots = 0;
  bool online = false;  // takes jobs: reachable and not draining
  bool reachable = false;
  bool draining = false;
  bool lost = false;  // since WorkerLost, until it comes online again
  // Unreachable since a restart, not yet back (WorkerAwaited): counted.
  bool awaited = false;
  // False for a worker only named by MarkRunning: it counts in no profile
  // until it comes online.
  bool registered = false;
  std::vector<JobId> owner;  // device -> job holding it; may pass `slots`
  int free = 0;              // devices below `slots` held by no job
  std::set<JobId> jobs;      // running jobs with a part here
  WorkerUsers users;
};

struct RunningJob {
  QueuedJob job;
  std::vector<Part> parts;
  TimeMs start = 0;
  TimeMs end = kNever;  // start + time limit
  Profile* profile = nullptr;
  Account* account = nullptr;
};

// A position in one queue (an account's, or one shape's of an account), for
// walking several in queue order.
struct Cursor {
  Order order;
  QueueKey key;
  Account* account = nullptr;
  const std::set<QueueKey>* queue = nullptr;
  Shape shape;
  std::set<QueueKey>::iterator pos;
  // A stand-in for the account's shapes, ordered at its first job (which
  // no job of the account precedes): they are walked when it comes first.
  bool expand = false;
};

bool Later(const Cursor& a, const Cursor& b) { return b.order < a.order; }

// The backfill reservation of a profile's first blocked job.
struct Reservation {
  TimeMs start = kNever;
  // Per worker the reservation takes slots on: slots free at `start` that
  // it does not need.
  Overrides slack;
};

}  // namespace

// Where queued jobs of a profile stand in its queue, in the last pass's
// order: for each (in the order asked), how many jobs are ahead and
// whether one of those could run on the online workers at all under its
// user's limit (then the reservation is not theirs); and the profile's
// first job in order.
struct QueueWalk {
  std::vector<int> ahead;
  std::vector<bool> runnable_ahead;
  JobId first = 0;
  int first_priority = 0;
};

struct PlacementCore::State {
  std::deque<Profile> profiles;  // creation order; addresses stay put
  std::unordered_map<std::string, Profile*> by_name;
  std::unordered_map<WorkerId, Worker> workers;
  std::unordered_map<JobId, QueuedJob> queued;
  std::unordered_map<JobId, RunningJob> running;
  TimeMs last_now = 0;
  UsageLedger ledger;
  ArrayLimits arrays;
  // Scratch space of Schedule, kept so that passes do not allocate.
  std::vector<Cursor> scratch_cursors;
  std::vector<Cursor> scratch_groups;
  Overrides scratch_free_at;

  Profile* FindProfile(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }

  Profile* GetProfile(const std::string& name) {
    if (Profile* p = FindProfile(name)) return p;
    Profile& p = profiles.emplace_back();
    p.name = name;
    by_name[name] = &p;
    return &p;
  }

  Worker* FindWorker(WorkerId id) {
    auto it = workers.find(id);
    return it == workers.end() ? nullptr : &it->second;
  }
  const Worker* FindWorker(WorkerId id) const {
    auto it = workers.find(id);
    return it == workers.end() ? nullptr : &it->second;
  }

  // Removes / adds the worker's share of its profile's totals. Every change
  // to slots, online or profile happens between the two.
  void Detach(Worker& w) {
    Profile* p = w.profile;
    if (p == nullptr || !w.registered) return;
    if (!w.users.anyone) {
      p->restricted.erase(w.id);
      ++p->users_gen;
    }
    --p->workers;
    p->known_slots -= w.slots;
    p->known_sizes.erase(p->known_sizes.find(w.slots));
    if (w.online) {
      --p->workers_online;
      p->online_slots -= w.slots;
      p->free_slots -= w.free;
      p->online_caps.erase({w.slots, w.id});
      p->free_caps.erase({w.free, w.id});
    }
  }
  void Attach(Worker& w) {
    Profile* p = w.profile;
    if (p == nullptr || !w.registered) return;
    if (!w.users.anyone) {
      p->restricted.insert(w.id);
      ++p->users_gen;
    }
    ++p->workers;
    p->known_slots += w.slots;
    p->known_sizes.insert(w.slots);
    if (w.online) {
      ++p->workers_online;
      p->online_slots += w.slots;
      p->free_slots += w.free;
      if (w.slots > 0) p->online_caps.insert({w.slots, w.id});
      if (w.free > 0) p->free_caps.insert({w.free, w.id});
    }
  }

  void SetFree(Worker& w, int free) {
    Profile* p = w.profile;
    if (p != nullptr && w.registered && w.online) {
      p->free_caps.erase({w.free, w.id});
      if (free > 0) p->free_caps.insert({free, w.id});
      p->free_slots += free - w.free;
    }
    w.free = free;
  }

  static int CountFree(const Worker& w) {
    int free = 0;
    for (int d = 0; d < w.slots; ++d) free += w.owner[d] == kNoJob;
    return free;
  }

  // Takes the `count` lowest free devices. REQUIRES: w.free >= count.
  std::vector<int> TakeDevices(Worker& w, JobId job, int count) {
    std::vector<int> devices;
    for (int d = 0; d < w.slots && static_cast<int>(devices.size()) < count;
         ++d) {
      if (w.owner[d] != kNoJob) continue;
      w.owner[d] = job;
      devices.push_back(d);
    }
    SetFree(w, w.free - static_cast<int>(devices.size()));
    return devices;
  }

  void ReleaseDevices(Worker& w, JobId job, const std::vector<int>& devices) {
    int freed = 0;
    for (int d : devices) {
      if (d < 0 || d >= static_cast<int>(w.owner.size()) || w.owner[d] != job) {
        continue;
      }
      w.owner[d] = kNoJob;
      if (d < w.slots) ++freed;
    }
    while (static_cast<int>(w.owner.size()) > w.slots &&
           w.owner.back() == kNoJob) {
      w.owner.pop_back();
    }
    SetFree(w, w.free + freed);
  }

  Account& GetAccount(Profile& p, const std::string& user) {
    auto [it, added] = p.accounts.try_emplace(user);
    if (added) it->second.user = &ledger.Get(user);
    return it->second;
  }

  // The user's usage as of `now`, for every account of the profile.
  void UpdateStandings(Profile& p, TimeMs now) {
    for (auto& [user, a] : p.accounts) {
      if (!a.queue.empty()) a.standing = ledger.Standing(*a.user, now);
    }
  }

  static bool Limited(const QueuedJob& job) {
    return job.array_id != 0 && job.array_limit > 0;
  }
  static ArrayMember MemberOf(const QueuedJob& job) {
    return {job.array_id, job.array_limit, job.priority, job.seq, job.id};
  }

  // A queued job's place in its account's queue, where passes find it.
  void AddToAccount(const QueuedJob& job) {
    Account& a = GetAccount(*GetProfile(job.profile), job.user);
    a.queue.insert(KeyOf(job));
    a.shapes[ShapeOf(job)].insert(KeyOf(job));
    ++a.pools[job.pool];
  }
  void RemoveFromAccount(const QueuedJob& job) {
    Profile* p = FindProfile(job.profile);
    Account& a = p->accounts.at(job.user);
    const QueueKey key = KeyOf(job);
    a.queue.erase(key);
    auto shape = a.shapes.find(ShapeOf(job));
    shape->second.erase(key);
    if (shape->second.empty()) a.shapes.erase(shape);
    auto pool = a.pools.find(job.pool);
    if (--pool->second == 0) a.pools.erase(pool);
    if (p->first_blocked == job.id) p->first_blocked.reset();
  }

  // A job of an array at its limit is queued (counted, explained) but
  // parked out of its account's queue until SettleArrays releases it.
  void AddQueued(const QueuedJob& job) {
    Profile* p = GetProfile(job.profile);
    queued[job.id] = job;
    GetAccount(*p, job.user);
    ++p->queued;
    if (Limited(job)) {
      arrays.Queued(MemberOf(job));
    } else {
      AddToAccount(job);
    }
  }

  bool RemoveQueued(JobId id) {
    auto it = queued.find(id);
    if (it == queued.end()) return false;
    const QueuedJob& job = it->second;
    if (!Limited(job) || !arrays.IsParked(MemberOf(job))) {
      RemoveFromAccount(job);
    }
    if (Limited(job)) arrays.Unqueued(MemberOf(job));
    Profile* p = FindProfile(job.profile);
    --p->queued;
    if (p->first_blocked == id) p->first_blocked.reset();
    queued.erase(it);
    return true;
  }

  // Moves array jobs between the queue and parking after the events since
  // the last call. Never during a pass: a pass walks the queues (and its
  // starts change no array's sum of released and running jobs).
  void SettleArrays() {
    arrays.Settle([&](JobId id) { AddToAccount(queued.at(id)); },
                  [&](JobId id) { RemoveFromAccount(queued.at(id)); });
  }

  void AddRunning(const QueuedJob& job, std::vector<Part> parts, TimeMs start) {
    RunningJob r;
    r.job = job;
    r.parts = std::move(parts);
    r.start = start;
    r.end = job.time_limit_ms > 0 ? AddSat(start, job.time_limit_ms) : kNever;
    r.profile = GetProfile(job.profile);
    r.account = &GetAccount(*r.profile, job.user);
    r.account->running_slots += job.pool;
    if (Limited(job)) arrays.Started(MemberOf(job));
    ledger.Started(*r.account->user, job.pool, start);
    ++r.profile->running;
    if (r.end != kNever) r.profile->ends.insert({r.end, job.id});
    for (const Part& part : r.parts) {
      if (Worker* w = FindWorker(part.worker)) w->jobs.insert(job.id);
    }
    running[job.id] = std::move(r);
  }

  // The job's user is charged its slots from its start to `end`.
  bool RemoveRunning(JobId id, TimeMs end) {
    auto it = running.find(id);
    if (it == running.end()) return false;
    RunningJob& r = it->second;
    r.account->running_slots -= r.job.pool;
    if (Limited(r.job)) arrays.Ended(MemberOf(r.job));
    ledger.Ended(*r.account->user, r.job.pool, r.start, end);
    for (const Part& part : r.parts) {
      Worker* w = FindWorker(part.worker);
      if (w == nullptr) continue;
      ReleaseDevices(*w, id, part.devices);
      w->jobs.erase(id);
    }
    --r.profile->running;
    r.profile->ends.erase({r.end, id});
    running.erase(it);
    return true;
  }

  // The workers of `p` that do not run `a`'s user's jobs, sorted; null if
  // none (every worker runs anyone's jobs: the common case costs nothing).
  const std::vector<WorkerId>* Barred(const Profile& p,
                                      const Account& a) const {
    if (p.restricted.empty()) return nullptr;
    if (a.barred_gen != p.users_gen) {
      a.barred.clear();
      for (WorkerId id : p.restricted) {
        if (FitOf(workers.at(id).users, a.user->name) != UserFit::kYes) {
          a.barred.push_back(id);
        }
      }
      a.barred_gen = p.users_gen;
    }
    return a.barred.empty() ? nullptr : &a.barred;
  }

  // Whether the job fits once every running job of its profile has ended,
  // on the workers not `barred`.
  static bool EverFits(const Profile& p, const QueuedJob& job,
                       const std::vector<WorkerId>* barred) {
    if (job.pool > p.online_slots) return false;
    return Place(View{&p.online_caps, nullptr, barred}, job.pool, job.max_nodes)
        .has_value();
  }

  // Where each of `asked` (queued jobs of `p`) stands in `p`'s queue, in
  // one walk of it (QueueWalk).
  QueueWalk Walk(const Profile& p, const std::vector<JobId>& asked) const;

  // `free_at` is scratch space. Workers in `barred` are left out.
  std::optional<Reservation> ComputeReservation(
      const Profile& p, const QueuedJob& job, TimeMs now, Overrides& free_at,
      const std::vector<WorkerId>* barred) const;

  // Marks the job running on `counts`, taking the lowest free devices.
  void Start(const QueuedJob& queued_job, const Counts& counts, TimeMs now,
             std::vector<Decision>& out);
  void Pass(Profile& p, TimeMs now, std::vector<Decision>& out);
  void Backfill(Profile& p, Reservation& res, const Order& head,
                const Account& head_account, int head_pool, TimeMs now,
                std::vector<Decision>& out);
};

// Walks the profile's running jobs in order of estimated end until the job
// fits in what they free (jobs without a limit end only at kNever).
std::optional<Reservation> PlacementCore::State::ComputeReservation(
    const Profile& p, const QueuedJob& job, TimeMs now, Overrides& free_at,
    const std::vector<WorkerId>* barred) const {
  if (!EverFits(p, job, barred)) return std::nullopt;
  free_at.clear();  // workers that free slots by the current time
  auto is_barred = [&](WorkerId w) {
    return barred != nullptr && Excluded(*barred, w);
  };
  int64_t total = p.free_slots;
  int largest = 0;
  for (auto it = p.free_caps.rbegin(); it != p.free_caps.rend(); ++it) {
    if (!is_barred(it->second)) {
      largest = it->first;
      break;
    }
  }
  if (barred != nullptr) {
    for (WorkerId id : *barred) {
      const Worker& w = workers.at(id);
      if (w.online && w.profile == &p) total -= w.free;
    }
  }
  const View view{&p.free_caps, &free_at, barred};
  // For a job that may span workers: workers per capacity, so that the test
  // "do the max_nodes largest hold the pool" costs O(largest worker).
  std::vector<int> by_cap;
  if (job.max_nodes > 1) {
    by_cap.assign(p.online_caps.rbegin()->first + 1, 0);
    for (const auto& [cap, worker] : p.free_caps) {
      if (!is_barred(worker)) ++by_cap[cap];
    }
  }
  auto fits = [&] {
    if (largest >= job.pool) return true;
    if (job.max_nodes <= 1 || total < job.pool) return false;
    int64_t sum = 0;
    int left = job.max_nodes;
    for (int cap = static_cast<int>(by_cap.size()) - 1; cap > 0 && left > 0;
         --cap) {
      const int take = std::min(by_cap[cap], left);
      sum += static_cast<int64_t>(take) * cap;
      left -= take;
    }
    return sum >= job.pool;
  };
  // Slack of each worker the reservation takes slots on; `all_free`: at
  // kNever, when every running job with a limit has ended. Slots of jobs
  // without one are no slack even then: a job backfilled there in an
  // earlier pass would otherwise be counted free, and its slot given twice.
  auto reserve = [&](TimeMs start, const Counts& counts, bool all_free) {
    Reservation res;
    res.start = start;
    for (const auto& [worker, needed] : counts) {
      const Worker& w = *FindWorker(worker);
      int cap = w.free;
      if (all_free) {
        cap = w.slots;
        for (int d = 0; d < w.slots; ++d) {
          cap -= w.owner[d] != kNoJob && running.at(w.owner[d]).end == kNever;
        }
      } else if (auto o = free_at.find(worker); o != free_at.end()) {
        cap = o->second;
      }
      res.slack[worker] = std::max(0, cap - needed);
    }
    return res;
  };
  if (fits()) {
    return reserve(now, *Place(view, job.pool, job.max_nodes), false);
  }
  for (auto e = p.ends.begin(); e != p.ends.end();) {
    const TimeMs t = e->first;
    for (; e != p.ends.end() && e->first == t; ++e) {
      const RunningJob& r = running.at(e->second);
      for (const Part& part : r.parts) {
        const Worker* w = FindWorker(part.worker);
        if (w == nullptr || !w->online || w->profile != &p ||
            is_barred(w->id)) {
          continue;
        }
        int released = 0;
        for (int d : part.devices) {
          released += d >= 0 && d < w->slots && w->owner[d] == r.job.id;
        }
        if (released == 0) continue;
        int& f = free_at.try_emplace(w->id, w->free).first->second;
        if (!by_cap.empty()) {
          if (f > 0) --by_cap[f];
          ++by_cap[f + released];
        }
        f += released;
        total += released;
        largest = std::max(largest, f);
      }
    }
    if (fits()) {
      return reserve(std::max(t, now), *Place(view, job.pool, job.max_nodes),
                     false);
    }
  }
  return reserve(
      kNever,
      *Place(View{&p.online_caps, nullptr, barred}, job.pool, job.max_nodes),
      true);
}

void PlacementCore::State::Start(const QueuedJob& queued_job,
                                 const Counts& counts, TimeMs now,
                                 std::vector<Decision>& out) {
  const QueuedJob job = queued_job;  // RemoveQueued frees the original
  Decision d;
  d.job = job.id;
  for (const auto& [worker, count] : counts) {
    d.parts.push_back({worker, TakeDevices(workers.at(worker), job.id, count)});
  }
  RemoveQueued(job.id);
  AddRunning(job, d.parts, now);
  out.push_back(std::move(d));
}

// Visits, in queue order, the queued jobs of `p` ordered after `after` (all
// of them if none) whose shape eligible(shape, account) takes, skipping the
// shapes its verdict rules out. What `eligible` takes may only shrink during
// a visit, and its verdicts must hold for the shapes they skip.
// visit(key, shape, account)
// may start that job (and nothing else) and returns false to stop.
// An account's shapes are looked at only when its first job after `after`
// comes up in order, so that a walk that stops early skips most accounts;
// accounts whose room(account) is below their smallest pool are skipped
// whole (room must bound the pools that `eligible` lets through).
// REQUIRES: the accounts' standings are those `after` was taken with.
template <typename Room, typename Eligible, typename Visit>
void ForEachEligible(Profile& p, const std::optional<Order>& after,
                     std::vector<Cursor>& heap, Room&& room,
                     Eligible&& eligible, Visit&& visit) {
  // The account's jobs ordered after `after` follow this key in its order.
  auto bound = [&](const Account& a) {
    QueueKey b{after->priority, after->seq, after->id};
    if (a.standing < after->standing) {
      b.seq = b.id = std::numeric_limits<int64_t>::max();
    } else if (a.standing > after->standing) {
      b.seq = b.id = std::numeric_limits<int64_t>::min();
    }
    return b;
  };
  heap.clear();
  for (auto& [user, a] : p.accounts) {
    if (room(a) < a.SmallestPool()) continue;
    auto pos = after ? a.queue.upper_bound(bound(a)) : a.queue.begin();
    if (pos == a.queue.end()) continue;
    heap.push_back({OrderOf(a, *pos), *pos, &a, &a.queue, Shape{}, pos, true});
  }
  std::make_heap(heap.begin(), heap.end(), Later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later);
    const Cursor c = heap.back();
    heap.pop_back();
    if (c.expand) {
      Account& a = *c.account;
      if (room(a) < a.SmallestPool()) continue;
      for (auto s = a.shapes.begin(); s != a.shapes.end();) {
        constexpr int kMin = std::numeric_limits<int>::min();
        switch (eligible(s->first, a)) {
          case Verdict::kTake:
            break;
          case Verdict::kSkip:
            ++s;
            continue;
          case Verdict::kNextPool:
            s = a.shapes.lower_bound({s->first.multi, s->first.pool + 1, kMin});
            continue;
          case Verdict::kNextMulti:
            s = s->first.multi ? a.shapes.end()
                               : a.shapes.lower_bound({true, kMin, kMin});
            continue;
        }
        auto pos = after ? s->second.upper_bound(bound(a)) : s->second.begin();
        if (pos != s->second.end()) {
          heap.push_back(
              {OrderOf(a, *pos), *pos, &a, &s->second, s->first, pos});
          std::push_heap(heap.begin(), heap.end(), Later);
        }
        ++s;
      }
      continue;
    }
    if (eligible(c.shape, *c.account) != Verdict::kTake) continue;
    auto next = std::next(c.pos);
    // Starting the job may erase its shape's queue, but only when empty.
    const bool last_of_shape = next == c.queue->end();
    if (!visit(c.key, c.shape, *c.account)) return;
    if (!last_of_shape) {
      heap.push_back({OrderOf(*c.account, *next), *next, c.account, c.queue,
                      c.shape, next});
      std::push_heap(heap.begin(), heap.end(), Later);
    }
  }
}

void PlacementCore::State::Pass(Profile& p, TimeMs now,
                                std::vector<Decision>& out) {
  UpdateStandings(p, now);
  p.first_blocked.reset();
  const View full{&p.free_caps};
  // Starts the job if it fits; else makes it the head if it ever can. A job
  // over its user's limit waits and holds no one back.
  std::optional<Reservation> res;
  const Account* head_account = nullptr;
  int head_pool = 0;
  auto visit = [&](JobId id, const Account& a) {
    const QueuedJob& job = queued.at(id);
    if (job.pool > a.Room()) return true;
    const std::vector<WorkerId>* barred = Barred(p, a);
    View view = full;
    view.barred = barred;
    if (auto counts = Place(view, job.pool, job.max_nodes)) {
      Start(job, *counts, now, out);
      return p.free_slots > 0;
    }
    res = ComputeReservation(p, job, now, scratch_free_at, barred);
    if (res) p.first_blocked = id;
    head_account = &a;
    head_pool = job.pool;
    return !res.has_value();
  };
  // Jobs that can never run on the online workers, or not under their
  // user's limit, hold no one back. Walk the queue in order; past a few of
  // them, walk only the shapes that could run.
  constexpr int kLinearSkips = 16;
  int skipped = 0;
  std::optional<Order> resume;
  std::vector<Cursor>& heap = scratch_groups;
  heap.clear();
  for (auto& [user, a] : p.accounts) {
    if (a.queue.empty()) continue;
    heap.push_back({OrderOf(a, *a.queue.begin()), *a.queue.begin(), &a,
                    &a.queue, Shape{}, a.queue.begin()});
  }
  std::make_heap(heap.begin(), heap.end(), Later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later);
    const Cursor c = heap.back();
    heap.pop_back();
    auto next = std::next(c.pos);  // visit may erase c.pos
    const bool last_of_group = next == c.queue->end();
    if (!visit(c.key.id, *c.account)) {
      if (!res) return;  // no free slot is left
      Backfill(p, *res, c.order, *head_account, head_pool, now, out);
      return;
    }
    if (queued.count(c.key.id) != 0 && ++skipped == kLinearSkips) {
      resume = c.order;
      break;
    }
    if (!last_of_group) {
      heap.push_back({OrderOf(*c.account, *next), *next, c.account, c.queue,
                      Shape{}, next});
      std::push_heap(heap.begin(), heap.end(), Later);
    }
  }
  if (!resume) return;
  const int64_t largest_online =
      p.online_caps.empty() ? 0 : p.online_caps.rbegin()->first;
  std::optional<Order> head;
  ForEachEligible(
      p, resume, scratch_cursors, [](const Account& a) { return a.Room(); },
      [&](const Shape& s, const Account& a) {
        return s.pool <= (s.multi ? p.online_slots : largest_online) &&
                       s.pool <= a.Room()
                   ? Verdict::kTake
                   : Verdict::kNextMulti;
      },
      [&](const QueueKey& key, const Shape&, const Account& a) {
        if (visit(key.id, a)) return true;
        if (res) head = OrderOf(a, key);
        return false;
      });
  if (head) Backfill(p, *res, *head, *head_account, head_pool, now, out);
}

// Starts jobs ordered after `head` that cannot delay its reservation: those
// whose limit ends by res.start anywhere, the others only on slack. A job of
// the head's account must leave the head room under its user's limit.
void PlacementCore::State::Backfill(Profile& p, Reservation& res,
                                    const Order& head,
                                    const Account& head_account, int head_pool,
                                    TimeMs now, std::vector<Decision>& out) {
  if (p.free_slots == 0) return;
  Overrides usable;  // reserved workers: min(free now, slack)
  auto refresh = [&](WorkerId w) {
    auto s = res.slack.find(w);
    if (s != res.slack.end()) {
      usable[w] = std::min(workers.at(w).free, s->second);
    }
  };
  for (const auto& [w, slack] : res.slack) refresh(w);

  int64_t full_single = 0, full_multi = 0, slack_single = 0, slack_multi = 0;
  auto bounds = [&] {
    full_single = p.free_caps.empty() ? 0 : p.free_caps.rbegin()->first;
    full_multi = p.free_slots;
    slack_single = 0;
    for (auto it = p.free_caps.rbegin(); it != p.free_caps.rend(); ++it) {
      if (usable.count(it->second) == 0) {
        slack_single = it->first;
        break;
      }
    }
    slack_multi = p.free_slots;
    for (const auto& [w, cap] : usable) {
      slack_single = std::max<int64_t>(slack_single, cap);
      slack_multi -= workers.at(w).free - cap;
    }
  };
  bounds();
  auto bound = [&](bool multi, bool may_end_first) {
    return may_end_first ? (multi ? full_multi : full_single)
                         : (multi ? slack_multi : slack_single);
  };
  // Even a job that ends first must leave the head room now: else the head
  // would be over its limit in the next pass, and lose its reservation.
  auto room = [&](const Account& a) {
    return a.Room(&a == &head_account ? head_pool : 0);
  };

  ForEachEligible(
      p, head, scratch_cursors, room,
      [&](const Shape& s, const Account& a) {
        // Full bounds are at least slack ones; limits ascend within a pool,
        // and past bucket 0 those that may end first come first.
        if (s.pool > room(a) || s.pool > bound(s.multi, true)) {
          return Verdict::kNextMulti;
        }
        const bool may_end_first =
            s.limit_bucket > 0 &&
            AddSat(now, BucketMinLimit(s.limit_bucket)) <= res.start;
        if (s.pool <= bound(s.multi, may_end_first)) return Verdict::kTake;
        return s.limit_bucket == 0 ? Verdict::kSkip : Verdict::kNextPool;
      },
      [&](const QueueKey& key, const Shape& shape, const Account& a) {
        const bool ends_first =
            key.limit > 0 && AddSat(now, key.limit) <= res.start;
        if (shape.pool > bound(shape.multi, ends_first)) return true;
        if (shape.pool > room(a)) return true;
        const QueuedJob& job = queued.at(key.id);
        auto counts = Place(
            View{&p.free_caps, ends_first ? nullptr : &usable, Barred(p, a)},
            job.pool, job.max_nodes);
        if (!counts) return true;
        Start(job, *counts, now, out);
        for (const auto& [w, n] : *counts) {
          if (!ends_first) {
            auto s = res.slack.find(w);
            if (s != res.slack.end()) s->second -= n;
          }
          refresh(w);
        }
        bounds();
        return p.free_slots > 0;
      });
}

UserFit FitOf(const WorkerUsers& users, const std::string& user) {
  // A job without a user runs as the worker's own user, anywhere.
  if (users.anyone || user.empty() || users.can.count(user) != 0) {
    return UserFit::kYes;
  }
  if (users.closed || users.cannot.count(user) != 0) return UserFit::kNo;
  return UserFit::kUndecided;
}

PlacementCore::PlacementCore() : state_(std::make_unique<State>()) {}
PlacementCore::~PlacementCore() = default;

void PlacementCore::AddProfile(const std::string& name, int max_pool) {
  state_->GetProfile(name)->max_pool = std::max(0, max_pool);
}

bool PlacementCore::HasProfile(const std::string& name) const {
  return state_->FindProfile(name) != nullptr;
}

void PlacementCore::WorkerOnline(WorkerId worker, const std::string& profile,
                                 int slots) {
  State& s = *state_;
  Worker& w = s.workers[worker];
  w.id = worker;
  s.Detach(w);
  w.profile = s.GetProfile(profile);
  w.slots = std::max(0, slots);
  if (static_cast<int>(w.owner.size()) < w.slots) {
    w.owner.resize(w.slots, kNoJob);
  }
  w.free = State::CountFree(w);
  w.reachable = true;
  w.lost = false;
  w.awaited = false;
  w.online = !w.draining;
  w.registered = true;
  s.Attach(w);
}

void PlacementCore::WorkerOffline(WorkerId worker) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr) return;
  state_->Detach(*w);
  w->online = false;
  w->reachable = false;
  w->awaited = false;
  state_->Attach(*w);
}

void PlacementCore::WorkerAwaited(WorkerId worker) {
  WorkerOffline(worker);
  if (Worker* w = state_->FindWorker(worker)) w->awaited = !w->lost;
}

void PlacementCore::SetDraining(WorkerId worker, bool draining) {
  State& s = *state_;
  Worker& w = s.workers[worker];
  w.id = worker;
  s.Detach(w);
  w.draining = draining;
  w.online = w.reachable && !draining;
  s.Attach(w);
}

std::vector<JobId> PlacementCore::WorkerLost(WorkerId worker) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr) return {};
  std::vector<JobId> lost(w->jobs.begin(), w->jobs.end());
  for (JobId job : lost) state_->RemoveRunning(job, state_->last_now);
  state_->SettleArrays();
  state_->Detach(*w);
  w->online = false;
  w->reachable = false;
  w->awaited = false;
  w->lost = true;
  state_->Attach(*w);
  return lost;
}

// Jobs still running there are dropped as by WorkerLost.
void PlacementCore::ForgetWorker(WorkerId worker) {
  WorkerLost(worker);
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr) return;
  state_->Detach(*w);
  state_->workers.erase(worker);
}

void PlacementCore::SetWorkerUsers(WorkerId worker, WorkerUsers users) {
  State& s = *state_;
  Worker& w = s.workers[worker];
  w.id = worker;
  s.Detach(w);
  w.users = std::move(users);
  s.Attach(w);
  if (w.profile != nullptr) ++w.profile->users_gen;
}

void PlacementCore::SetWorkerUser(WorkerId worker, const std::string& user,
                                  bool can) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr || w->users.anyone) return;
  if (can) {
    w->users.cannot.erase(user);
    w->users.can.insert(user);
  } else {
    w->users.can.erase(user);
    w->users.cannot.insert(user);
  }
  if (w->profile != nullptr) ++w->profile->users_gen;
}

void PlacementCore::ForgetWorkerUser(WorkerId worker, const std::string& user) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr || w->users.anyone) return;
  w->users.can.erase(user);
  w->users.cannot.erase(user);
  if (w->profile != nullptr) ++w->profile->users_gen;
}

std::vector<std::pair<WorkerId, UserFit>> PlacementCore::UserFits(
    const std::string& profile, const std::string& user) const {
  std::vector<std::pair<WorkerId, UserFit>> out;
  const Profile* p = state_->FindProfile(profile);
  if (p == nullptr) return out;
  for (const auto& [id, w] : state_->workers) {
    if (w.profile == p && w.registered) {
      out.emplace_back(id, FitOf(w.users, user));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The offline workers a submit check leaves out of a profile, as its
// messages say them.
struct LeftOut {
  bool any = false;  // some were: the profile's size counts online workers
  std::string note;  // said after the size: "; 'w2' is offline since ..."
  std::string wait;  // "wait for w2 to return" where they would let the job
                     // fit; else empty
};

// Whether `job` fits the workers of `p` whose slot counts are `sizes`
// (largest first), the workers in `left` left out.
absl::Status FitsSizes(const Profile& p, const QueuedJob& job,
                       const std::vector<int>& sizes, const LeftOut& left) {
  int64_t total = 0;
  for (int n : sizes) total += n;
  const std::string size =
      absl::StrCat(Plural(total, "slot", "slots"), " on ",
                   Plural(static_cast<int64_t>(sizes.size()),
                          left.any ? "online worker" : "worker",
                          left.any ? "online workers" : "workers"),
                   left.note);
  const std::string or_wait =
      left.wait.empty() ? "" : absl::StrCat(", or ", left.wait);
  if (sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " exceeds profile '", p.name, "' (", size, "); ",
        left.any ? absl::StrCat("no worker of it is online; ", left.wait,
                                left.wait.empty() ? "" : ", ")
                 : "no worker has joined it; ",
        "start a worker with this profile or use another profile"));
  }
  const int nodes = std::max(1, job.max_nodes);
  int64_t top = 0;  // most slots on `nodes` workers
  for (int i = 0; i < nodes && i < static_cast<int>(sizes.size()); ++i) {
    top += sizes[i];
  }
  int64_t best = top;
  if (p.max_pool > 0) best = std::min<int64_t>(best, p.max_pool);
  if (job.pool > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", job.pool, " exceeds profile '", p.name, "' (",
                     size, "); use --pool ", best,
                     left.wait.empty() ? " or another profile" : or_wait));
  }
  if (job.pool > top) {
    if (nodes == 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool ", job.pool, " does not fit on one worker of profile '", p.name,
          "' (", size, "): the largest worker has ",
          Plural(sizes.front(), "slot", "slots"),
          "; allow the job to span workers with max_nodes, or use --pool ",
          best, or_wait));
    }
    int needed = 0;
    int64_t sum = 0;
    for (auto it = sizes.begin(); sum < job.pool; ++it) {
      sum += *it;
      ++needed;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " does not fit on ", nodes, " workers of profile '",
        p.name, "' (", size, "): the ", nodes, " largest hold ",
        Plural(top, "slot", "slots"), "; raise max_nodes to ", needed,
        ", or use --pool ", best, or_wait));
  }
  return absl::OkStatus();
}

// Offline workers named in one message at most; the rest are counted.
constexpr size_t kNamedOffline = 4;

// `left` for the offline workers `offline` (by id), named by `labels`.
LeftOut DescribeOffline(const std::vector<WorkerId>& offline,
                        const WorkerLabeler& labels) {
  LeftOut left;
  left.any = !offline.empty();
  std::vector<std::string> said, names;
  for (WorkerId id : offline) {
    if (said.size() == kNamedOffline) {
      said.push_back(absl::StrCat(offline.size() - kNamedOffline, " more ",
                                  offline.size() - kNamedOffline == 1
                                      ? "worker is offline"
                                      : "workers are offline"));
      break;
    }
    WorkerLabel label =
        labels ? labels(id) : WorkerLabel{absl::StrCat("#", id), "offline"};
    said.push_back(absl::StrCat("'", label.name, "' is ", label.state));
    names.push_back(std::move(label.name));
  }
  if (left.any) left.note = absl::StrCat("; ", absl::StrJoin(said, ", "));
  if (offline.size() > kNamedOffline) {
    left.wait = "wait for the offline workers to return";
  } else if (!names.empty()) {
    const std::string last = names.back();
    names.pop_back();
    left.wait = absl::StrCat("wait for ", absl::StrJoin(names, ", "),
                             names.empty() ? "" : " and ", last, " to return");
  }
  return left;
}

}  // namespace

absl::Status PlacementCore::CheckSatisfiable(
    const QueuedJob& job, const WorkerLabeler& labels) const {
  const Profile* p = state_->FindProfile(job.profile);
  if (p == nullptr) {
    std::vector<std::string> names;
    for (const Profile& known : state_->profiles) names.push_back(known.name);
    if (names.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "unknown profile '", job.profile,
          "'; no profiles are defined yet; start a worker for it"));
    }
    return absl::NotFoundError(
        absl::StrCat("unknown profile '", job.profile,
                     "'; known profiles: ", absl::StrJoin(names, ", ")));
  }
  if (job.pool < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", job.pool,
                     " is not valid; a job needs at least 1 slot; use --pool "
                     "1 or more"));
  }
  if (p->max_pool > 0 && job.pool > p->max_pool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " exceeds the max_pool of profile '", p->name, "' (",
        p->max_pool, "); use --pool ", p->max_pool, " or less"));
  }
  // Capacity is what is connected, draining or not (a drained worker comes
  // back with `admin resume`), and what is expected back after a restart;
  // an offline worker's slots are not capacity, nor a lost one's.
  std::vector<int> sizes, with_offline;
  std::vector<WorkerId> offline;
  for (const auto& [id, w] : state_->workers) {
    if (!w.registered || w.profile != p) continue;
    with_offline.push_back(w.slots);
    if (!w.lost && (w.reachable || w.awaited)) {
      sizes.push_back(w.slots);
    } else {
      offline.push_back(id);
    }
  }
  std::sort(sizes.rbegin(), sizes.rend());
  absl::Status fits = FitsSizes(*p, job, sizes, {});
  if (fits.ok() || offline.empty()) return fits;
  std::sort(offline.begin(), offline.end());
  LeftOut left = DescribeOffline(offline, labels);
  std::sort(with_offline.rbegin(), with_offline.rend());
  if (!FitsSizes(*p, job, with_offline, {}).ok()) left.wait.clear();
  return FitsSizes(*p, job, sizes, left);
}

std::vector<std::pair<JobId, std::string>> PlacementCore::Unrunnable() const {
  std::vector<std::pair<JobId, std::string>> out;
  for (const auto& [id, job] : state_->queued) {
    const Profile* p = state_->FindProfile(job.profile);
    if (p == nullptr) continue;
    std::vector<int> sizes(p->known_sizes.rbegin(), p->known_sizes.rend());
    absl::Status fits = FitsSizes(*p, job, sizes, {});
    if (!fits.ok()) out.emplace_back(id, std::string(fits.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void PlacementCore::Enqueue(const QueuedJob& job) {
  if (IsQueued(job.id) || IsRunning(job.id)) return;
  QueuedJob j = job;
  j.pool = std::max(1, j.pool);
  j.max_nodes = std::max(1, j.max_nodes);
  j.time_limit_ms = std::max<TimeMs>(0, j.time_limit_ms);
  state_->AddQueued(j);
  state_->SettleArrays();
}

bool PlacementCore::Dequeue(JobId job) {
  const bool was = state_->RemoveQueued(job);
  state_->SettleArrays();
  return was;
}

void PlacementCore::MarkRunning(const QueuedJob& job,
                                const std::vector<Part>& parts, TimeMs start) {
  State& s = *state_;
  s.RemoveQueued(job.id);
  s.RemoveRunning(job.id, s.last_now);
  QueuedJob j = job;
  j.max_nodes = std::max(1, j.max_nodes);
  j.time_limit_ms = std::max<TimeMs>(0, j.time_limit_ms);
  Profile* p = s.GetProfile(j.profile);
  std::vector<Part> sorted = parts;
  for (Part& part : sorted) {
    std::sort(part.devices.begin(), part.devices.end());
    auto [it, added] = s.workers.try_emplace(part.worker);
    Worker& w = it->second;
    if (added) {
      w.id = part.worker;
      w.profile = p;
    }
    int taken = 0;
    for (int d : part.devices) {
      if (d < 0) continue;
      if (d >= static_cast<int>(w.owner.size())) w.owner.resize(d + 1, kNoJob);
      if (w.owner[d] != kNoJob) continue;  // held by another job: keep it
      w.owner[d] = j.id;
      if (d < w.slots) ++taken;
    }
    s.SetFree(w, w.free - taken);
  }
  s.AddRunning(j, std::move(sorted), start);
  s.SettleArrays();
}

bool PlacementCore::Finished(JobId job) {
  return Finished(job, state_->last_now);
}

bool PlacementCore::Finished(JobId job, TimeMs end) {
  const bool was = state_->RemoveRunning(job, end);
  state_->SettleArrays();
  return was;
}

std::vector<Decision> PlacementCore::Schedule(TimeMs now) {
  State& s = *state_;
  s.last_now = now;
  s.ledger.Rebase(now);
  std::vector<Decision> out;
  for (Profile& p : s.profiles) {
    p.first_blocked.reset();
    // A pass's starts can move the head's reservation onto other slots (best
    // fit among what is free then), so that a job the old reservation held
    // back fits now: passes repeat until one starts nothing, and a pass is
    // then a fixed point. Bounded, so that a pass's cost stays bounded.
    for (int i = 0;
         i < kMaxPassesPerSchedule && p.queued > 0 && p.free_slots > 0; ++i) {
      const size_t before = out.size();
      s.Pass(p, now, out);
      if (out.size() == before) break;
    }
    // A pass stops at the last free slot it gives, before any head.
    p.blocked_walk = p.queued > 0 && p.free_slots == 0 && !p.first_blocked;
  }
  s.SettleArrays();  // starts keep every array's sum: nothing moves
  return out;
}

absl::Status PlacementCore::CheckAdmission(const QueuedJob& job,
                                           int count) const {
  const Profile* p = state_->FindProfile(job.profile);
  if (p == nullptr) return absl::OkStatus();
  auto it = p->accounts.find(job.user);
  if (it == p->accounts.end()) return absl::OkStatus();
  const Account& a = it->second;
  const std::string fix =
      absl::StrCat("or ask an admin to raise it (dlbatch admin limit set ",
                   job.user, " --profile ", p->name);
  if (a.limit.max_slots >= 0 && job.pool > a.limit.max_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " exceeds the limit of ", job.user, " on '", p->name,
        "' (", Plural(a.limit.max_slots, "slot", "slots"),
        " at once); use --pool ", a.limit.max_slots, " or less, ", fix,
        " --slots N)"));
  }
  const int64_t queued = static_cast<int64_t>(a.queue.size());
  if (a.limit.max_queued >= 0 && queued + count > a.limit.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job.user, " has ", queued, " of their ", a.limit.max_queued,
        " queued jobs on '", p->name, "'",
        count > 1 ? absl::StrCat(" and submits ", count, " more") : "",
        "; wait for some to start, cancel some, ", fix, " --queued N)"));
  }
  return absl::OkStatus();
}

void PlacementCore::SetLimit(const std::string& user,
                             const std::string& profile,
                             const UserLimit& limit) {
  State& s = *state_;
  UserLimit l = limit;
  l.max_slots = std::max(kNoLimit, l.max_slots);
  l.max_queued = std::max(kNoLimit, l.max_queued);
  s.GetAccount(*s.GetProfile(profile), user).limit = l;
}

UserLimit PlacementCore::GetLimit(const std::string& user,
                                  const std::string& profile) const {
  const Profile* p = state_->FindProfile(profile);
  if (p == nullptr) return {};
  auto it = p->accounts.find(user);
  return it == p->accounts.end() ? UserLimit{} : it->second.limit;
}

std::vector<LimitEntry> PlacementCore::Limits() const {
  std::vector<LimitEntry> out;
  for (const Profile& p : state_->profiles) {
    const size_t first = out.size();
    for (const auto& [user, a] : p.accounts) {
      if (a.limit != UserLimit{}) out.push_back({user, p.name, a.limit});
    }
    std::sort(out.begin() + first, out.end(),
              [](const LimitEntry& x, const LimitEntry& y) {
                return x.user < y.user;
              });
  }
  return out;
}

void PlacementCore::SetFairShareHalfLife(TimeMs half_life) {
  state_->ledger.SetHalfLife(half_life);
}

void PlacementCore::ChargeUsage(const std::string& user, double slot_ms,
                                TimeMs at) {
  state_->ledger.Charge(state_->ledger.Get(user), slot_ms, at);
}

double PlacementCore::EndedUsage(const std::string& user, TimeMs at) const {
  const UsageLedger::User* u = state_->ledger.Find(user);
  return u == nullptr ? 0 : state_->ledger.Ended(*u, at);
}

std::vector<UserUsage> PlacementCore::Usage(TimeMs now) const {
  const UsageLedger& ledger = state_->ledger;
  std::vector<UserUsage> out;
  double total = 0;
  for (const auto& [name, u] : ledger.users()) {
    UserUsage uu;
    uu.user = name;
    uu.slot_seconds = ledger.Decayed(u, now) / 1000;
    uu.running_slots = static_cast<int>(u.running);
    total += uu.slot_seconds;
    out.push_back(std::move(uu));
  }
  for (UserUsage& uu : out) {
    uu.share = total > 0 ? uu.slot_seconds / total : 0;
  }
  std::sort(out.begin(), out.end(), [](const UserUsage& a, const UserUsage& b) {
    if (a.slot_seconds != b.slot_seconds)
      return a.slot_seconds < b.slot_seconds;
    return a.user < b.user;
  });
  return out;
}

// What Explain says of a queued job but the jobs ahead of it: its needs,
// the profile's workers and its user's standing.
// REQUIRES: job is queued.
WaitInfo PlacementCore::ExplainStanding(JobId job) const {
  const State& s = *state_;
  const auto q = s.queued.find(job);
  const Profile& p = *s.FindProfile(q->second.profile);
  WaitInfo info;
  info.needed = q->second.pool;
  info.free_now = static_cast<int>(p.free_slots);
  info.largest_free = p.free_caps.empty() ? 0 : p.free_caps.rbegin()->first;
  info.online_slots = static_cast<int>(p.online_slots);
  const Account& mine = p.accounts.at(q->second.user);
  info.user = q->second.user;
  info.user_slots = static_cast<int>(mine.running_slots);
  info.user_slot_limit = mine.limit.max_slots;
  info.over_limit = q->second.pool > mine.Room();
  if (State::Limited(q->second)) {
    info.array_limited = s.arrays.IsParked(State::MemberOf(q->second));
    info.array = *s.arrays.Standing(q->second.array_id);
  }
  for (const auto& [cap, id] : p.online_caps) {
    switch (FitOf(s.workers.at(id).users, info.user)) {
      case UserFit::kYes:
        ++info.able_workers;
        info.able_free += s.workers.at(id).free;
        break;
      case UserFit::kUndecided:
        ++info.undecided_workers;
        [[fallthrough]];
      case UserFit::kNo:
        ++info.unable_workers;
        break;
    }
  }
  info.fits_online = State::EverFits(p, q->second, s.Barred(p, mine));
  if (p.workers_online < p.workers) {  // some are draining or not connected
    for (const auto& [id, w] : s.workers) {
      if (!w.registered || w.profile != &p || w.online) continue;
      const bool may_run = FitOf(w.users, info.user) != UserFit::kNo;
      if (!w.reachable) {
        info.offline_slots += w.slots;
        if (may_run) info.offline.push_back(id);
      } else {
        info.draining_slots += w.slots;
        if (may_run) info.draining.push_back(id);
      }
    }
    std::sort(info.offline.begin(), info.offline.end());
    std::sort(info.draining.begin(), info.draining.end());
  }
  return info;
}

std::optional<WaitInfo> PlacementCore::Explain(JobId job) const {
  const State& s = *state_;
  auto q = s.queued.find(job);
  if (q == s.queued.end()) return std::nullopt;
  WaitInfo info = ExplainStanding(job);
  const Profile& p = *s.FindProfile(q->second.profile);
  const Account& mine = p.accounts.at(q->second.user);
  // The order of the last pass: usage as of its time (one standing per
  // account, as QueueOrder takes it).
  const QueueKey my_key = KeyOf(q->second);
  const Order me{my_key.priority, s.ledger.Standing(*mine.user, s.last_now),
                 my_key.seq, my_key.id};
  // The reservation belongs to the first job in order that could run on the
  // online workers at all, under its user's limit.
  bool head_ahead = false;
  std::optional<Order> first;
  for (const auto& [user, a] : p.accounts) {
    const double standing = s.ledger.Standing(*a.user, s.last_now);
    for (const QueueKey& key : a.queue) {
      const Order o{key.priority, standing, key.seq, key.id};
      if (!(o < me)) break;
      ++info.jobs_ahead;
      if (!first || o < *first) first = o;
      if (!head_ahead) {
        const QueuedJob& job = s.queued.at(key.id);
        head_ahead =
            job.pool <= a.Room() && State::EverFits(p, job, s.Barred(p, a));
      }
    }
  }
  if (first) {
    info.first_ahead = first->id;
    info.first_ahead_priority = first->priority;
  }
  FinishExplain(job, head_ahead, &info);
  return info;
}

// Each job counts as ahead of every asked-for job ordered after it (a
// difference array over the asked-for jobs in order): O(q log k) for q
// queued and k asked. Each account's queue is in order, so its walk for
// the first runnable job stops at its first, or once past the best found.
QueueWalk PlacementCore::State::Walk(const Profile& p,
                                     const std::vector<JobId>& asked) const {
  auto order = [&](const Account& a, const QueueKey& key) {
    return Order{key.priority, ledger.Standing(*a.user, last_now), key.seq,
                 key.id};
  };
  std::vector<std::pair<Order, size_t>> mine;
  for (size_t i = 0; i < asked.size(); ++i) {
    const QueuedJob& job = queued.at(asked[i]);
    mine.push_back({order(p.accounts.at(job.user), KeyOf(job)), i});
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<int> behind(mine.size() + 1, 0);
  std::optional<Order> first;
  std::optional<Order> runnable;
  for (const auto& [user, a] : p.accounts) {
    const double standing = ledger.Standing(*a.user, last_now);
    bool looking = true;
    for (const QueueKey& key : a.queue) {
      const Order o{key.priority, standing, key.seq, key.id};
      auto after = std::upper_bound(
          mine.begin(), mine.end(), o,
          [](const Order& x, const auto& m) { return x < m.first; });
      ++behind[after - mine.begin()];
      if (!first || o < *first) first = o;
      if (looking && runnable && !(o < *runnable)) looking = false;
      if (looking) {
        const QueuedJob& job = queued.at(key.id);
        if (job.pool <= a.Room() && EverFits(p, job, Barred(p, a))) {
          runnable = o;
          looking = false;
        }
      }
    }
  }
  QueueWalk walk;
  walk.ahead.resize(asked.size());
  walk.runnable_ahead.resize(asked.size());
  int count = 0;
  for (size_t j = 0; j < mine.size(); ++j) {
    count += behind[j];
    walk.ahead[mine[j].second] = count;
    walk.runnable_ahead[mine[j].second] = runnable && *runnable < mine[j].first;
  }
  if (first) {
    walk.first = first->id;
    walk.first_priority = first->priority;
  }
  return walk;
}

namespace {

// `jobs` that are queued, by profile: their ids and places in `jobs`.
template <typename Queued, typename FindProfile>
std::map<const Profile*, std::pair<std::vector<JobId>, std::vector<size_t>>>
QueuedByProfile(const std::vector<JobId>& jobs, const Queued& queued,
                const FindProfile& find_profile) {
  std::map<const Profile*, std::pair<std::vector<JobId>, std::vector<size_t>>>
      out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto q = queued.find(jobs[i]);
    if (q == queued.end()) continue;
    auto& [ids, places] = out[find_profile(q->second.profile)];
    ids.push_back(jobs[i]);
    places.push_back(i);
  }
  return out;
}

}  // namespace

std::vector<std::optional<WaitInfo>> PlacementCore::ExplainMany(
    const std::vector<JobId>& jobs) const {
  const State& s = *state_;
  std::vector<std::optional<WaitInfo>> out(jobs.size());
  auto find = [&](const std::string& name) { return s.FindProfile(name); };
  for (const auto& [profile, asked] : QueuedByProfile(jobs, s.queued, find)) {
    const auto& [ids, places] = asked;
    const QueueWalk walk = s.Walk(*profile, ids);
    for (size_t j = 0; j < ids.size(); ++j) {
      WaitInfo info = ExplainStanding(ids[j]);
      info.jobs_ahead = walk.ahead[j];
      if (walk.ahead[j] > 0) {
        info.first_ahead = walk.first;
        info.first_ahead_priority = walk.first_priority;
      }
      FinishExplain(ids[j], walk.runnable_ahead[j], &info);
      out[places[j]] = std::move(info);
    }
  }
  return out;
}

std::vector<int> PlacementCore::QueuePositions(
    const std::vector<JobId>& jobs) const {
  const State& s = *state_;
  std::vector<int> out(jobs.size(), 0);
  auto find = [&](const std::string& name) { return s.FindProfile(name); };
  for (const auto& [profile, asked] : QueuedByProfile(jobs, s.queued, find)) {
    const auto& [ids, places] = asked;
    const QueueWalk walk = s.Walk(*profile, ids);
    for (size_t j = 0; j < ids.size(); ++j) {
      const QueuedJob& job = s.queued.at(ids[j]);
      const bool parked =
          State::Limited(job) && s.arrays.IsParked(State::MemberOf(job));
      out[places[j]] = parked ? 0 : walk.ahead[j] + 1;
    }
  }
  return out;
}

// The rest of Explain once the jobs ahead are known: the position, and
// the backfill reservation of a job with nobody runnable ahead.
void PlacementCore::FinishExplain(JobId job, bool head_ahead,
                                  WaitInfo* out) const {
  const State& s = *state_;
  const auto q = s.queued.find(job);
  const Profile& p = *s.FindProfile(q->second.profile);
  const Account& mine = p.accounts.at(q->second.user);
  WaitInfo& info = *out;
  if (!info.array_limited) info.position = info.jobs_ahead + 1;
  if (!head_ahead && !info.over_limit && !info.array_limited) {
    Overrides free_at;
    if (auto res = s.ComputeReservation(p, q->second, s.last_now, free_at,
                                        s.Barred(p, mine))) {
      info.reserved = true;
      info.reserved_start = res->start;
    }
  }
}

std::vector<JobId> PlacementCore::QueueOrder(const std::string& profile) const {
  const State& s = *state_;
  const Profile* p = s.FindProfile(profile);
  std::vector<JobId> out;
  if (p == nullptr) return out;
  // Each account's queue is in order already; usage is one per account, as
  // of the last pass's time, as Explain and the next pass's order take it.
  std::vector<std::pair<Order, JobId>> all;
  for (const auto& [user, a] : p->accounts) {
    const double standing = s.ledger.Standing(*a.user, s.last_now);
    for (const QueueKey& key : a.queue) {
      all.push_back({Order{key.priority, standing, key.seq, key.id}, key.id});
    }
  }
  std::sort(all.begin(), all.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  out.reserve(all.size());
  for (const auto& entry : all) out.push_back(entry.second);
  return out;
}

std::optional<JobId> PlacementCore::FirstBlocked(
    const std::string& profile) const {
  const State& s = *state_;
  const Profile* p = s.FindProfile(profile);
  if (p == nullptr) return std::nullopt;
  if (!p->blocked_walk || p->free_slots > 0) return p->first_blocked;
  // Full: the pass's head is the first job in order that it would not skip.
  std::optional<Order> best;
  for (const auto& [user, a] : p->accounts) {
    if (a.queue.empty() || a.Room() < a.SmallestPool()) continue;
    const std::vector<WorkerId>* barred = s.Barred(*p, a);
    const double standing = s.ledger.Standing(*a.user, s.last_now);
    for (const QueueKey& key : a.queue) {
      const Order o{key.priority, standing, key.seq, key.id};
      if (best && !(o < *best)) break;
      const QueuedJob& job = s.queued.at(key.id);
      if (job.pool <= a.Room() && State::EverFits(*p, job, barred)) {
        best = o;
        break;
      }
    }
  }
  if (!best) return std::nullopt;
  return best->id;
}

std::optional<PlacementSnapshot> PlacementCore::PreemptionSnapshot(
    JobId job, TimeMs now) const {
  const State& s = *state_;
  auto q = s.queued.find(job);
  if (q == s.queued.end()) return std::nullopt;
  const Profile& p = *s.FindProfile(q->second.profile);
  const Account& mine = p.accounts.at(q->second.user);
  PlacementSnapshot snap;
  snap.job = q->second;
  snap.within_limit = q->second.pool <= mine.Room() &&
                      !(State::Limited(q->second) &&
                        s.arrays.IsParked(State::MemberOf(q->second)));
  snap.user_slots = static_cast<int>(mine.running_slots);
  snap.user_slot_limit = mine.limit.max_slots;
  const std::vector<WorkerId>* barred = s.Barred(p, mine);
  for (const auto& [cap, id] : p.online_caps) {
    if (barred == nullptr || !Excluded(*barred, id)) {
      snap.workers.push_back({id, cap, s.workers.at(id).free});
    }
  }
  std::sort(
      snap.workers.begin(), snap.workers.end(),
      [](const WorkerSlots& a, const WorkerSlots& b) { return a.id < b.id; });
  snap.running.reserve(p.running);
  for (const auto& [id, r] : s.running) {
    if (r.profile != &p) continue;
    if (r.job.priority > q->second.priority) {
      ++snap.higher;
    } else {
      snap.running.push_back(
          {id, r.job.user, r.job.priority, r.parts, r.start});
    }
  }
  std::sort(
      snap.running.begin(), snap.running.end(),
      [](const RunningSlots& a, const RunningSlots& b) { return a.id < b.id; });
  std::set<std::string> active;
  for (const Profile& other : s.profiles) {
    for (const auto& [user, a] : other.accounts) {
      if (!a.queue.empty() || a.running_slots > 0) active.insert(user);
    }
  }
  double total = 0;
  for (const std::string& user : active) {
    const UsageLedger::User& u = *s.ledger.Find(user);
    UserUsage& uu = snap.active_usage.emplace_back();
    uu.user = user;
    uu.slot_seconds = s.ledger.Decayed(u, now) / 1000;
    uu.running_slots = static_cast<int>(u.running);
    total += uu.slot_seconds;
  }
  for (UserUsage& uu : snap.active_usage) {
    uu.share = total > 0 ? uu.slot_seconds / total : 0;
  }
  return snap;
}

bool PlacementCore::FitsWithReleased(JobId job,
                                     const std::vector<JobId>& released) const {
  const State& s = *state_;
  auto q = s.queued.find(job);
  if (q == s.queued.end()) return false;
  const Profile& p = *s.FindProfile(q->second.profile);
  const Account& mine = p.accounts.at(q->second.user);
  if (q->second.pool > mine.Room()) return false;
  if (State::Limited(q->second) &&
      s.arrays.IsParked(State::MemberOf(q->second))) {
    return false;
  }
  Overrides freed;  // free slots of the workers the released jobs free
  const std::set<JobId> unique(released.begin(), released.end());
  for (JobId id : unique) {
    auto r = s.running.find(id);
    if (r == s.running.end()) continue;
    for (const Part& part : r->second.parts) {
      const Worker* w = s.FindWorker(part.worker);
      if (w == nullptr || !w->online || w->profile != &p) continue;
      int& cap = freed.try_emplace(w->id, w->free).first->second;
      for (int d : part.devices) {
        cap += d >= 0 && d < w->slots && w->owner[d] == id;
      }
    }
  }
  return Place(View{&p.free_caps, &freed, s.Barred(p, mine)}, q->second.pool,
               q->second.max_nodes)
      .has_value();
}

std::vector<ProfileSummary> PlacementCore::Profiles() const {
  std::vector<ProfileSummary> out;
  for (const Profile& p : state_->profiles) {
    ProfileSummary ps;
    ps.name = p.name;
    ps.max_pool_configured = p.max_pool;
    ps.workers = p.workers;
    ps.workers_online = p.workers_online;
    ps.online_slots = static_cast<int>(p.online_slots);
    ps.free_slots = static_cast<int>(p.free_slots);
    ps.known_slots = static_cast<int>(p.known_slots);
    ps.largest_worker = p.known_sizes.empty() ? 0 : *p.known_sizes.rbegin();
    ps.queued = static_cast<int>(p.queued);
    ps.running = p.running;
    out.push_back(std::move(ps));
  }
  return out;
}

std::vector<int> PlacementCore::FreeDevices(WorkerId worker) const {
  const Worker* w = state_->FindWorker(worker);
  std::vector<int> free;
  if (w == nullptr) return free;
  for (int d = 0; d < w->slots; ++d) {
    if (w->owner[d] == kNoJob) free.push_back(d);
  }
  return free;
}

size_t PlacementCore::queued_count() const { return state_->queued.size(); }
size_t PlacementCore::running_count() const { return state_->running.size(); }
bool PlacementCore::IsQueued(JobId job) const {
  return state_->queued.count(job) != 0;
}
bool PlacementCore::IsRunning(JobId job) const {
  return state_->running.count(job) != 0;
}

}  // namespace dlbatch::scheduler
