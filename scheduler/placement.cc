#include "scheduler/placement.h"

#include <algorithm>
#include <bit>
#include <compare>
#include <deque>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

// What bounds where a queued job can go. Within one (multi, limit_bucket)
// group, pools ascend, so a pass skips a group's larger pools at once.
struct Shape {
  bool multi = false;
  int limit_bucket = 0;  // see LimitBucket
  int pool = 0;
  auto operator<=>(const Shape&) const = default;
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
  return {job.max_nodes > 1, LimitBucket(job.time_limit_ms), job.pool};
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
struct View {
  const CapSet* base = nullptr;
  const Overrides* overrides = nullptr;

  bool Overridden(WorkerId w) const {
    return overrides != nullptr && overrides->count(w) != 0;
  }
};

bool Excluded(const std::vector<WorkerId>& sorted_exclude, WorkerId w) {
  return std::binary_search(sorted_exclude.begin(), sorted_exclude.end(), w);
}

// The worker with the least capacity >= need (ties: lower id), skipping
// `sorted_exclude`.
std::optional<std::pair<int, WorkerId>> BestFit(
    const View& view, int need, const std::vector<WorkerId>& sorted_exclude) {
  std::optional<std::pair<int, WorkerId>> best;
  for (auto it =
           view.base->lower_bound({need, std::numeric_limits<WorkerId>::min()});
       it != view.base->end(); ++it) {
    if (view.Overridden(it->second) || Excluded(sorted_exclude, it->second)) {
      continue;
    }
    best = *it;
    break;
  }
  if (view.overrides != nullptr) {
    for (const auto& [worker, cap] : *view.overrides) {
      std::pair<int, WorkerId> candidate{cap, worker};
      if (cap >= need && !Excluded(sorted_exclude, worker) &&
          (!best || candidate < *best)) {
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
      if (cap > 0) extra.emplace_back(cap, worker);
    }
    std::sort(extra.rbegin(), extra.rend());
  }
  auto it = view.base->rbegin();
  size_t i = 0;
  while (true) {
    while (it != view.base->rend() && view.Overridden(it->second)) ++it;
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
  std::set<QueueKey> queue;
  std::map<Shape, std::set<QueueKey>> shapes;  // the queue, by shape
  int running = 0;
  std::set<std::pair<TimeMs, JobId>> ends;  // running jobs with a limit
};

struct Worker {
  WorkerId id = 0;
  Profile* profile = nullptr;
  int slots = 0;
  bool online = false;
  // False for a worker only named by MarkRunning: it counts in no profile
  // until it comes online.
  bool registered = false;
  std::vector<JobId> owner;  // device -> job holding it; may pass `slots`
  int free = 0;              // devices below `slots` held by no job
  std::set<JobId> jobs;      // running jobs with a part here
};

struct RunningJob {
  QueuedJob job;
  std::vector<Part> parts;
  TimeMs end = kNever;  // start + time limit
  Profile* profile = nullptr;
};

// A position in one shape's queue, for walking several in queue order.
struct Cursor {
  QueueKey key;
  std::map<Shape, std::set<QueueKey>>::iterator shape;
  std::set<QueueKey>::iterator pos;
};

// The backfill reservation of a profile's first blocked job.
struct Reservation {
  TimeMs start = kNever;
  // Per worker the reservation takes slots on: slots free at `start` that
  // it does not need.
  Overrides slack;
};

}  // namespace

struct PlacementCore::State {
  std::deque<Profile> profiles;  // creation order; addresses stay put
  std::unordered_map<std::string, Profile*> by_name;
  std::unordered_map<WorkerId, Worker> workers;
  std::unordered_map<JobId, QueuedJob> queued;
  std::unordered_map<JobId, RunningJob> running;
  TimeMs last_now = 0;
  // Scratch space of Schedule, kept so that passes do not allocate.
  std::vector<Cursor> scratch_cursors;
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

  void AddQueued(const QueuedJob& job) {
    Profile* p = GetProfile(job.profile);
    queued[job.id] = job;
    p->queue.insert(KeyOf(job));
    p->shapes[ShapeOf(job)].insert(KeyOf(job));
  }

  bool RemoveQueued(JobId id) {
    auto it = queued.find(id);
    if (it == queued.end()) return false;
    Profile* p = FindProfile(it->second.profile);
    const QueueKey key = KeyOf(it->second);
    p->queue.erase(key);
    auto shape = p->shapes.find(ShapeOf(it->second));
    shape->second.erase(key);
    if (shape->second.empty()) p->shapes.erase(shape);
    queued.erase(it);
    return true;
  }

  void AddRunning(const QueuedJob& job, std::vector<Part> parts, TimeMs start) {
    RunningJob r;
    r.job = job;
    r.parts = std::move(parts);
    r.end = job.time_limit_ms > 0 ? AddSat(start, job.time_limit_ms) : kNever;
    r.profile = GetProfile(job.profile);
    ++r.profile->running;
    if (r.end != kNever) r.profile->ends.insert({r.end, job.id});
    for (const Part& part : r.parts) {
      if (Worker* w = FindWorker(part.worker)) w->jobs.insert(job.id);
    }
    running[job.id] = std::move(r);
  }

  bool RemoveRunning(JobId id) {
    auto it = running.find(id);
    if (it == running.end()) return false;
    RunningJob& r = it->second;
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

  // Whether the job fits once every running job of its profile has ended.
  static bool EverFits(const Profile& p, const QueuedJob& job) {
    if (job.pool > p.online_slots) return false;
    return Place(View{&p.online_caps}, job.pool, job.max_nodes).has_value();
  }

  // `free_at` is scratch space.
  std::optional<Reservation> ComputeReservation(const Profile& p,
                                                const QueuedJob& job,
                                                TimeMs now,
                                                Overrides& free_at) const;

  // Marks the job running on `counts`, taking the lowest free devices.
  void Start(const QueuedJob& queued_job, const Counts& counts, TimeMs now,
             std::vector<Decision>& out);
  void Pass(Profile& p, TimeMs now, std::vector<Decision>& out);
  void Backfill(Profile& p, Reservation& res, const QueueKey& head, TimeMs now,
                std::vector<Decision>& out);
};

// Walks the profile's running jobs in order of estimated end until the job
// fits in what they free (jobs without a limit end only at kNever).
std::optional<Reservation> PlacementCore::State::ComputeReservation(
    const Profile& p, const QueuedJob& job, TimeMs now,
    Overrides& free_at) const {
  if (!EverFits(p, job)) return std::nullopt;
  free_at.clear();  // workers that free slots by the current time
  int64_t total = p.free_slots;
  int largest = p.free_caps.empty() ? 0 : p.free_caps.rbegin()->first;
  const View view{&p.free_caps, &free_at};
  // For a job that may span workers: workers per capacity, so that the test
  // "do the max_nodes largest hold the pool" costs O(largest worker).
  std::vector<int> by_cap;
  if (job.max_nodes > 1) {
    by_cap.assign(p.online_caps.rbegin()->first + 1, 0);
    for (const auto& [cap, worker] : p.free_caps) ++by_cap[cap];
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
  // kNever, when every running job has ended.
  auto reserve = [&](TimeMs start, const Counts& counts, bool all_free) {
    Reservation res;
    res.start = start;
    for (const auto& [worker, needed] : counts) {
      const Worker& w = *FindWorker(worker);
      int cap = all_free ? w.slots : w.free;
      if (auto o = free_at.find(worker); !all_free && o != free_at.end()) {
        cap = o->second;
      }
      res.slack[worker] = cap - needed;
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
        if (w == nullptr || !w->online || w->profile != &p) continue;
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
  return reserve(kNever, *Place(View{&p.online_caps}, job.pool, job.max_nodes),
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

// Visits, in queue order, the queued jobs of `p` ordered after `after` whose
// shape passes `eligible`; skips the rest of a (multi, limit_bucket) group at
// the first pool that fails. `eligible` must only turn false during a visit.
// visit(key, shape) may start that job (and nothing else) and returns
// false to stop.
template <typename Eligible, typename Visit>
void ForEachEligible(Profile& p, const QueueKey& after,
                     std::vector<Cursor>& heap, Eligible&& eligible,
                     Visit&& visit) {
  auto later = [](const Cursor& a, const Cursor& b) { return b.key < a.key; };
  heap.clear();
  for (auto s = p.shapes.begin(); s != p.shapes.end();) {
    if (!eligible(s->first)) {
      s = p.shapes.lower_bound({s->first.multi, s->first.limit_bucket + 1,
                                std::numeric_limits<int>::min()});
      continue;
    }
    auto pos = s->second.upper_bound(after);
    if (pos != s->second.end()) heap.push_back({*pos, s, pos});
    ++s;
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Cursor c = heap.back();
    heap.pop_back();
    if (!eligible(c.shape->first)) continue;
    auto next = std::next(c.pos);
    const bool last_of_shape = next == c.shape->second.end();
    const Shape shape = c.shape->first;  // starting the job may erase it
    if (!visit(c.key, shape)) return;
    if (!last_of_shape) {
      heap.push_back({*next, c.shape, next});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
}

void PlacementCore::State::Pass(Profile& p, TimeMs now,
                                std::vector<Decision>& out) {
  const View full{&p.free_caps};
  // Starts the job if it fits; else makes it the head if it ever can.
  std::optional<Reservation> res;
  auto visit = [&](JobId id) {
    const QueuedJob& job = queued.at(id);
    if (auto counts = Place(full, job.pool, job.max_nodes)) {
      Start(job, *counts, now, out);
      return p.free_slots > 0;
    }
    res = ComputeReservation(p, job, now, scratch_free_at);
    return !res.has_value();
  };
  // Jobs that can never run on the online workers hold no one back. Walk the
  // queue in order; past a few of them, walk only the shapes that could run.
  constexpr int kLinearSkips = 16;
  int skipped = 0;
  std::optional<QueueKey> resume;
  for (auto it = p.queue.begin(); it != p.queue.end() && !res;) {
    const QueueKey key = *it++;  // visit may erase *it
    if (!visit(key.id)) {
      if (!res) return;  // no free slot is left
      Backfill(p, *res, key, now, out);
      return;
    }
    if (queued.count(key.id) != 0 && ++skipped == kLinearSkips) {
      resume = key;
      break;
    }
  }
  if (!resume) return;
  const int64_t largest_online =
      p.online_caps.empty() ? 0 : p.online_caps.rbegin()->first;
  std::optional<QueueKey> head;
  ForEachEligible(
      p, *resume, scratch_cursors,
      [&](const Shape& s) {
        return s.pool <= (s.multi ? p.online_slots : largest_online);
      },
      [&](const QueueKey& key, const Shape&) {
        if (visit(key.id)) return true;
        if (res) head = key;
        return false;
      });
  if (head) Backfill(p, *res, *head, now, out);
}

// Starts jobs ordered after `head` that cannot delay its reservation: those
// whose limit ends by res.start anywhere, the others only on slack.
void PlacementCore::State::Backfill(Profile& p, Reservation& res,
                                    const QueueKey& head, TimeMs now,
                                    std::vector<Decision>& out) {
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

  ForEachEligible(
      p, head, scratch_cursors,
      [&](const Shape& s) {
        const bool may_end_first =
            s.limit_bucket > 0 &&
            AddSat(now, BucketMinLimit(s.limit_bucket)) <= res.start;
        return s.pool <= bound(s.multi, may_end_first);
      },
      [&](const QueueKey& key, const Shape& shape) {
        const bool ends_first =
            key.limit > 0 && AddSat(now, key.limit) <= res.start;
        if (shape.pool > bound(shape.multi, ends_first)) return true;
        const QueuedJob& job = queued.at(key.id);
        auto counts = Place(View{&p.free_caps, ends_first ? nullptr : &usable},
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
  w.online = true;
  w.registered = true;
  s.Attach(w);
}

void PlacementCore::WorkerOffline(WorkerId worker) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr) return;
  state_->Detach(*w);
  w->online = false;
  state_->Attach(*w);
}

std::vector<JobId> PlacementCore::WorkerLost(WorkerId worker) {
  Worker* w = state_->FindWorker(worker);
  if (w == nullptr) return {};
  std::vector<JobId> lost(w->jobs.begin(), w->jobs.end());
  for (JobId job : lost) state_->RemoveRunning(job);
  state_->Detach(*w);
  w->online = false;
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

absl::Status PlacementCore::CheckSatisfiable(const QueuedJob& job) const {
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
  const std::string size =
      absl::StrCat(Plural(p->known_slots, "slot", "slots"), " on ",
                   Plural(p->workers, "worker", "workers"));
  if (p->workers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " exceeds profile '", p->name, "' (", size,
        "); no worker has joined it; start a worker with this profile or "
        "use another profile"));
  }
  const int nodes = std::max(1, job.max_nodes);
  int64_t top = 0;  // most slots on `nodes` known workers
  int taken = 0;
  for (auto it = p->known_sizes.rbegin();
       it != p->known_sizes.rend() && taken < nodes; ++it, ++taken) {
    top += *it;
  }
  int64_t best = top;
  if (p->max_pool > 0) best = std::min<int64_t>(best, p->max_pool);
  if (job.pool > p->known_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", job.pool, " exceeds profile '", p->name, "' (",
                     size, "); use --pool ", best, " or another profile"));
  }
  if (job.pool > top) {
    const int largest = *p->known_sizes.rbegin();
    if (nodes == 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool ", job.pool, " does not fit on one worker of profile '",
          p->name, "' (", size, "): the largest worker has ",
          Plural(largest, "slot", "slots"),
          "; allow the job to span workers with max_nodes, or use --pool ",
          best));
    }
    int needed = 0;
    int64_t sum = 0;
    for (auto it = p->known_sizes.rbegin(); sum < job.pool; ++it) {
      sum += *it;
      ++needed;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", job.pool, " does not fit on ", nodes, " workers of profile '",
        p->name, "' (", size, "): the ", nodes, " largest hold ",
        Plural(top, "slot", "slots"), "; raise max_nodes to ", needed,
        ", or use --pool ", best));
  }
  return absl::OkStatus();
}

void PlacementCore::Enqueue(const QueuedJob& job) {
  if (IsQueued(job.id) || IsRunning(job.id)) return;
  QueuedJob j = job;
  j.pool = std::max(1, j.pool);
  j.max_nodes = std::max(1, j.max_nodes);
  j.time_limit_ms = std::max<TimeMs>(0, j.time_limit_ms);
  state_->AddQueued(j);
}

bool PlacementCore::Dequeue(JobId job) { return state_->RemoveQueued(job); }

void PlacementCore::MarkRunning(const QueuedJob& job,
                                const std::vector<Part>& parts, TimeMs start) {
  State& s = *state_;
  s.RemoveQueued(job.id);
  s.RemoveRunning(job.id);
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
}

bool PlacementCore::Finished(JobId job) { return state_->RemoveRunning(job); }

std::vector<Decision> PlacementCore::Schedule(TimeMs now) {
  State& s = *state_;
  s.last_now = now;
  std::vector<Decision> out;
  for (Profile& p : s.profiles) {
    if (!p.queue.empty() && p.free_slots > 0) s.Pass(p, now, out);
  }
  return out;
}

std::optional<WaitInfo> PlacementCore::Explain(JobId job) const {
  const State& s = *state_;
  auto q = s.queued.find(job);
  if (q == s.queued.end()) return std::nullopt;
  const Profile& p = *s.FindProfile(q->second.profile);
  WaitInfo info;
  info.needed = q->second.pool;
  info.free_now = static_cast<int>(p.free_slots);
  info.largest_free = p.free_caps.empty() ? 0 : p.free_caps.rbegin()->first;
  info.online_slots = static_cast<int>(p.online_slots);
  info.offline_slots = static_cast<int>(p.known_slots - p.online_slots);
  // The reservation belongs to the first job in order that could run on the
  // online workers at all.
  bool head_ahead = false;
  const QueueKey key = KeyOf(q->second);
  for (auto it = p.queue.begin(); it != p.queue.end() && *it < key; ++it) {
    if (info.jobs_ahead++ == 0) {
      info.first_ahead = it->id;
      info.first_ahead_priority = it->priority;
    }
    if (!head_ahead) head_ahead = State::EverFits(p, s.queued.at(it->id));
  }
  if (!head_ahead) {
    Overrides free_at;
    if (auto res = s.ComputeReservation(p, q->second, s.last_now, free_at)) {
      info.reserved = true;
      info.reserved_start = res->start;
    }
  }
  return info;
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
    ps.queued = static_cast<int>(p.queue.size());
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
