#include "scheduler/core/preemption.h"

#include <algorithm>
#include <compare>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlbatch::scheduler {
namespace {

// Shares are ratios of sums of doubles: equal usages may differ in the last
// bits, and must not read as above or below the fair share.
constexpr double kShareEpsilon = 1e-9;

// A running job that may be taken, with what it frees on the workers that
// take the waiting job (by index into the model's workers).
struct Option {
  const PreemptionCandidate* c = nullptr;
  PreemptionKind kind = PreemptionKind::kPriority;
  TimeMs lost = 0;
  // (worker index, slots), in a buffer the options share: most jobs hold
  // one part, and a vector each would cost an allocation each.
  struct Freed {
    const std::pair<int, int>* first = nullptr;
    const std::pair<int, int>* last = nullptr;
    const std::pair<int, int>* begin() const { return first; }
    const std::pair<int, int>* end() const { return last; }
  } freed;
  int total = 0;  // freed, summed
};

// The cost of a set of victims, least first (see the header's "Choice").
struct Cost {
  int count = 0;
  int64_t lost = 0;
  int64_t priority = 0;
  int64_t neg_start = 0;  // more recent starts cost less
  auto operator<=>(const Cost&) const = default;

  void Add(const Option& o) {
    ++count;
    lost += o.lost;
    priority += o.c->priority;
    neg_start -= o.c->started;
  }
  void Remove(const Option& o) {
    --count;
    lost -= o.lost;
    priority -= o.c->priority;
    neg_start += o.c->started;
  }
};

std::vector<JobId> SortedIds(const std::vector<int>& set,
                             const std::vector<Option>& options) {
  std::vector<JobId> ids;
  for (int i : set) ids.push_back(options[i].c->id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The best set found so far: its cost, then its ids, decide.
struct Best {
  bool found = false;
  Cost cost;
  std::vector<int> set;  // option indices

  void Offer(const Cost& c, const std::vector<int>& s,
             const std::vector<Option>& options) {
    if (found) {
      if (c > cost) return;
      if (c == cost && SortedIds(s, options) >= SortedIds(set, options)) {
        return;
      }
    }
    found = true;
    cost = c;
    set = s;
  }
};

// Where the waiting job would go once a set of victims has ended: the
// placement rule of the core (one worker with room for the pool, else the
// max_nodes roomiest workers holding it together) over the workers that
// take the job now.
class Model {
 public:
  Model(const std::vector<WorkerSlots>& workers, int pool, int max_nodes)
      : pool_(pool), max_nodes_(std::max(1, max_nodes)) {
    for (const WorkerSlots& w : workers) {
      index_[w.id] = static_cast<int>(free_.size());
      free_.push_back(std::clamp(w.free, 0, std::max(0, w.slots)));
      slots_.push_back(std::max(0, w.slots));
      total_free_ += free_.back();
    }
    cap_ = free_;
    mark_.assign(free_.size(), 0);
    for (size_t i = 0; i < free_.size(); ++i) {
      order_.push_back(static_cast<int>(i));
    }
    std::sort(order_.begin(), order_.end(),
              [&](int a, int b) { return free_[a] > free_[b]; });
  }

  int Index(WorkerId id) const {
    auto it = index_.find(id);
    return it == index_.end() ? -1 : it->second;
  }
  int size() const { return static_cast<int>(free_.size()); }
  int free(int w) const { return free_[w]; }
  int slots(int w) const { return slots_[w]; }
  int max_nodes() const { return max_nodes_; }
  int64_t total_free() const { return total_free_; }

  // The most of the pool the job could place once `set` has ended: the
  // pool itself when it fits.
  int Placeable(const std::vector<int>& set,
                const std::vector<Option>& options) {
    for (int i : set) {
      for (const auto& [w, n] : options[i].freed) {
        if (!mark_[w]) {
          mark_[w] = 1;
          touched_.push_back(w);
        }
        cap_[w] = std::min(slots_[w], cap_[w] + n);
      }
    }
    // The max_nodes roomiest: among the touched workers and the roomiest
    // max_nodes untouched ones.
    tops_.clear();
    for (int w : touched_) tops_.push_back(cap_[w]);
    int untouched = 0;
    for (int w : order_) {
      if (untouched == max_nodes_) break;
      if (!mark_[w]) {
        tops_.push_back(free_[w]);
        ++untouched;
      }
    }
    std::sort(tops_.rbegin(), tops_.rend());
    int64_t sum = 0;
    for (int i = 0; i < max_nodes_ && i < static_cast<int>(tops_.size()); ++i) {
      sum += tops_[i];
    }
    const int best = static_cast<int>(std::min<int64_t>(pool_, sum));
    for (int w : touched_) {
      cap_[w] = free_[w];
      mark_[w] = 0;
    }
    touched_.clear();
    return best;
  }

  bool Fits(const std::vector<int>& set, const std::vector<Option>& options) {
    return Placeable(set, options) >= pool_;
  }

 private:
  int pool_;
  int max_nodes_;
  std::unordered_map<WorkerId, int> index_;
  std::vector<int> free_, slots_, cap_;
  std::vector<char> mark_;
  std::vector<int> order_;  // by free, most first
  std::vector<int> touched_, tops_;
  int64_t total_free_ = 0;
};

// Counts of the running jobs left out, for the reason text.
struct Untaken {
  int not_preemptible = 0;
  int too_young = 0;
  int not_lower = 0;
  int displacer = 0;
};

std::string UntakenText(const Untaken& l, const PreemptionPolicy& policy) {
  std::vector<std::string> parts;
  auto jobs = [](int n) { return absl::StrCat(n, n == 1 ? " job" : " jobs"); };
  if (l.not_lower > 0) {
    parts.push_back(absl::StrCat(
        jobs(l.not_lower), " of equal or higher priority",
        policy.mode == PreemptionMode::kFairShare ? " (and no reclaim)" : ""));
  }
  if (l.not_preemptible > 0) {
    parts.push_back(absl::StrCat(jobs(l.not_preemptible), " not preemptible"));
  }
  if (l.too_young > 0) {
    parts.push_back(absl::StrCat(jobs(l.too_young), " inside min_run (",
                                 DurationText(policy.min_run_ms), ")"));
  }
  if (l.displacer > 0) {
    parts.push_back(
        absl::StrCat(jobs(l.displacer), " that preempted it before"));
  }
  return parts.empty() ? "no job runs there" : absl::StrJoin(parts, ", ");
}

PreemptionChoice None(NoPreemption why, std::string reason) {
  PreemptionChoice c;
  c.why = why;
  c.reason = std::move(reason);
  return c;
}

constexpr int kNoK = std::numeric_limits<int>::max();  // no set frees enough

// The options holding slots on worker `w`, to free its missing `need`.
struct WorkerSearch {
  int w = 0;
  int need = 0;
  std::vector<std::pair<int, int>> held;  // (slots on w, option), most first
  int k = 0;                              // the fewest that free `need`
};

// Offers `best` every k-subset of s.held that frees at least s.need.
// Returns false when `budget` (leaves weighed) ran out first.
bool EnumerateOnWorker(const WorkerSearch& s, const std::vector<Option>& opts,
                       int64_t& budget, Best& best) {
  const int n = static_cast<int>(s.held.size());
  std::vector<int> prefix(n + 1, 0);  // prefix[i]: slots of held[0, i)
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + s.held[i].first;
  std::vector<int> chosen;
  Cost cost;
  bool complete = true;
  auto rec = [&](auto&& self, int from, int sum) -> void {
    const int left = s.k - static_cast<int>(chosen.size());
    if (left == 0) {
      if (--budget < 0) {
        complete = false;
        return;
      }
      if (sum >= s.need) best.Offer(cost, chosen, opts);
      return;
    }
    for (int i = from; i + left <= n; ++i) {
      // held[i, i + left) free the most of what is left: past them, less.
      if (sum + prefix[i + left] - prefix[i] < s.need) return;
      const Option& o = opts[s.held[i].second];
      chosen.push_back(s.held[i].second);
      cost.Add(o);
      self(self, i + 1, sum + s.held[i].first);
      cost.Remove(o);
      chosen.pop_back();
      if (!complete) return;
    }
  };
  rec(rec, 0, 0);
  return complete;
}

// max_nodes 1: worker by worker (see the header's "Search").
Best SearchOneWorker(Model& model, const std::vector<Option>& opts, int pool,
                     bool& exact) {
  std::vector<WorkerSearch> searches;
  std::unordered_map<int, size_t> search_of;  // worker index -> search
  for (int i = 0; i < static_cast<int>(opts.size()); ++i) {
    for (const auto& [w, n] : opts[i].freed) {
      if (model.slots(w) < pool) continue;
      auto [it, added] = search_of.try_emplace(w, searches.size());
      if (added) searches.push_back({w, pool - model.free(w), {}, 0});
      searches[it->second].held.emplace_back(n, i);
    }
  }
  int kmin = kNoK;
  for (WorkerSearch& s : searches) {
    std::sort(s.held.begin(), s.held.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first > b.first;
      return opts[a.second].lost < opts[b.second].lost;
    });
    int sum = 0;
    s.k = 0;
    while (s.k < static_cast<int>(s.held.size()) && sum < s.need) {
      sum += s.held[s.k++].first;
    }
    if (sum < s.need) s.k = kNoK;
    kmin = std::min(kmin, s.k);
  }
  Best best;
  if (kmin == kNoK) return best;
  int64_t budget = kSingleWorkerBudget;
  for (const WorkerSearch& s : searches) {
    if (s.k != kmin) continue;
    if (!EnumerateOnWorker(s, opts, budget, best)) {
      exact = false;
      if (!best.found) {  // the largest first: a set of the fewest
        Cost cost;
        std::vector<int> set;
        for (int i = 0; i < kmin; ++i) {
          set.push_back(s.held[i].second);
          cost.Add(opts[s.held[i].second]);
        }
        best.Offer(cost, set, opts);
      }
      break;
    }
  }
  return best;
}

// max_nodes > 1: greedy, then subsets by size (see the header's "Search").
// REQUIRES: every option gone, the job fits.
Best SearchSpan(Model& model, const std::vector<Option>& opts, int pool,
                bool& exact) {
  std::vector<int> order(opts.size());
  for (size_t i = 0; i < opts.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (opts[a].total != opts[b].total) return opts[a].total > opts[b].total;
    return opts[a].lost < opts[b].lost;
  });
  // Greedy by worker: the max_nodes workers with the most room once all
  // their candidates are gone; then the candidates freeing the most on
  // those workers first (the cheaper on ties) until the job fits. Every
  // candidate gone fits (REQUIRES), so their workers' room suffices.
  std::vector<int64_t> room(model.size());
  for (int w = 0; w < model.size(); ++w) room[w] = model.free(w);
  for (const Option& o : opts) {
    for (const auto& [w, n] : o.freed) room[w] += n;
  }
  std::vector<int> workers(model.size());
  for (int w = 0; w < model.size(); ++w) {
    room[w] = std::min<int64_t>(room[w], model.slots(w));
    workers[w] = w;
  }
  const int span = std::min(model.max_nodes(), model.size());
  std::partial_sort(workers.begin(), workers.begin() + span, workers.end(),
                    [&](int a, int b) { return room[a] > room[b]; });
  std::vector<char> target(model.size(), 0);
  for (int i = 0; i < span; ++i) target[workers[i]] = 1;
  std::vector<std::pair<int, int>> gains;  // (slots on targets, option)
  for (int i = 0; i < static_cast<int>(opts.size()); ++i) {
    int gain = 0;
    for (const auto& [w, n] : opts[i].freed) gain += target[w] ? n : 0;
    if (gain > 0) gains.emplace_back(gain, i);
  }
  std::sort(gains.begin(), gains.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return opts[a.second].lost < opts[b.second].lost;
  });
  std::vector<int> greedy;
  for (const auto& [gain, i] : gains) {
    greedy.push_back(i);
    if (model.Fits(greedy, opts)) break;
  }
  if (!model.Fits(greedy, opts)) return Best{};  // not reached (REQUIRES)
  // Drops the costliest victims the job does not need.
  std::sort(greedy.begin(), greedy.end(),
            [&](int a, int b) { return opts[a].lost > opts[b].lost; });
  for (size_t i = 0; i < greedy.size();) {
    std::vector<int> without = greedy;
    without.erase(without.begin() + static_cast<long>(i));
    if (model.Fits(without, opts)) {
      greedy = std::move(without);
    } else {
      ++i;
    }
  }
  Best fallback;
  {
    Cost cost;
    for (int i : greedy) cost.Add(opts[i]);
    fallback.Offer(cost, greedy, opts);
  }
  // Subsets by size, from the fewest that free enough slots in sum.
  const int n = static_cast<int>(order.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + opts[order[i]].total;
  const int64_t need = pool - model.total_free();
  int k = 1;
  while (k < n && prefix[k] < need) ++k;
  int64_t budget = kSpanBudget;
  const int greedy_k = static_cast<int>(greedy.size());
  for (; k <= greedy_k; ++k) {
    Best best;
    std::vector<int> chosen;
    Cost cost;
    bool complete = true;
    auto rec = [&](auto&& self, int from, int64_t sum) -> void {
      const int left = k - static_cast<int>(chosen.size());
      if (left == 0) {
        if (--budget < 0) {
          complete = false;
          return;
        }
        if (model.Fits(chosen, opts)) best.Offer(cost, chosen, opts);
        return;
      }
      for (int i = from; i + left <= n; ++i) {
        if (sum + prefix[i + left] - prefix[i] < need) return;
        const Option& o = opts[order[i]];
        chosen.push_back(order[i]);
        cost.Add(o);
        self(self, i + 1, sum + o.total);
        cost.Remove(o);
        chosen.pop_back();
        if (!complete) return;
      }
    };
    rec(rec, 0, 0);
    if (k == greedy_k) best.Offer(fallback.cost, fallback.set, opts);
    if (best.found) {
      if (!complete && k < greedy_k) exact = false;
      return best;
    }
    if (!complete) {
      exact = false;
      return fallback;
    }
  }
  return fallback;
}

bool ReclaimedFrom(const WaitingJob& job) {
  return std::any_of(
      job.displaced.begin(), job.displaced.end(),
      [](const Displacement& d) { return d.kind == PreemptionKind::kReclaim; });
}

}  // namespace

TimeMs LostWorkMs(const PreemptionCandidate& c, TimeMs now) {
  TimeMs since = c.started;
  if (c.checkpoint && *c.checkpoint > since) since = *c.checkpoint;
  return std::max<TimeMs>(0, now - since);
}

std::vector<JobId> PreemptionChoice::ids() const {
  std::vector<JobId> out;
  for (const Victim& v : victims) out.push_back(v.id);
  return out;
}

PreemptionChoice ChooseVictims(const PreemptionInput& input,
                               const PreemptionPolicy& policy, TimeMs now) {
  const WaitingJob& job = input.job;
  if (policy.mode == PreemptionMode::kOff) {
    return None(NoPreemption::kOff, "preemption is off on its profile");
  }
  if (!input.within_limit) {
    return None(NoPreemption::kOverLimit,
                absl::StrCat("its user's limit holds it (", input.user_slots,
                             " of ", input.user_slot_limit,
                             " slots running); preemption makes no room "
                             "under a limit"));
  }
  Model model(input.workers, job.pool, job.max_nodes);
  std::vector<Option> all;  // every running job, to tell kNeverFits
  all.reserve(input.running.size());
  size_t parts = 0;
  for (const PreemptionCandidate& c : input.running) parts += c.parts.size();
  std::vector<std::pair<int, int>> freed;  // the options' Freed point here
  freed.reserve(parts);
  for (const PreemptionCandidate& c : input.running) {
    Option o;
    o.c = &c;
    const size_t first = freed.size();
    for (const Part& part : c.parts) {
      const int w = model.Index(part.worker);
      if (w < 0) continue;
      int n = 0;
      for (int d : part.devices) n += d >= 0 && d < model.slots(w);
      if (n > 0) {
        freed.emplace_back(w, n);
        o.total += n;
      }
    }
    o.freed = {freed.data() + first, freed.data() + freed.size()};
    all.push_back(o);
  }
  if (model.Fits({}, all)) {
    return None(NoPreemption::kFitsNow, "it fits without preempting");
  }
  {
    std::vector<int> every(all.size());
    for (size_t i = 0; i < all.size(); ++i) every[i] = static_cast<int>(i);
    if (!model.Fits(every, all)) {
      return None(NoPreemption::kNeverFits,
                  "it would not fit the workers that take it now even with "
                  "every running job of its priority or lower gone");
    }
  }

  // Fair shares, for reclaims.
  const double fair =
      input.usage.empty() ? 0 : 1.0 / static_cast<double>(input.usage.size());
  auto share_of = [&](const std::string& user) {
    for (const UserUsage& u : input.usage) {
      if (u.user == user) return u.share;
    }
    return 0.0;
  };
  const bool may_reclaim = policy.mode == PreemptionMode::kFairShare &&
                           !ReclaimedFrom(job) &&
                           share_of(job.user) < fair - kShareEpsilon;
  std::vector<Option> opts;
  Untaken left;
  left.not_lower = input.higher_running;
  for (Option& o : all) {
    const PreemptionCandidate& c = *o.c;
    if (o.total == 0) continue;  // frees nothing the job could use
    if (!c.preemptible) {
      ++left.not_preemptible;
      continue;
    }
    if (now - c.started < policy.min_run_ms) {
      ++left.too_young;
      continue;
    }
    const bool displaced_me =
        std::any_of(job.displaced.begin(), job.displaced.end(),
                    [&](const Displacement& d) { return d.by == c.id; });
    if (displaced_me && c.priority >= job.priority) {
      ++left.displacer;
      continue;
    }
    if (c.priority < job.priority) {
      o.kind = PreemptionKind::kPriority;
    } else if (may_reclaim && c.priority == job.priority &&
               c.user != job.user && share_of(c.user) > fair + kShareEpsilon) {
      o.kind = PreemptionKind::kReclaim;
    } else {
      ++left.not_lower;
      continue;
    }
    o.lost = LostWorkMs(c, now);
    opts.push_back(o);
  }
  {
    std::vector<int> every(opts.size());
    for (size_t i = 0; i < opts.size(); ++i) every[i] = static_cast<int>(i);
    if (!model.Fits(every, opts)) {
      return None(
          NoPreemption::kNoVictims,
          absl::StrCat(opts.empty() ? "no running job may be preempted for it"
                                    : "the running jobs that may be preempted "
                                      "for it would not free enough",
                       " (", UntakenText(left, policy), ")"));
    }
  }
  PreemptionChoice choice;
  Best best = job.max_nodes <= 1
                  ? SearchOneWorker(model, opts, job.pool, choice.exact)
                  : SearchSpan(model, opts, job.pool, choice.exact);
  if (!best.found) {  // not reached: every option together fits
    return None(NoPreemption::kNoVictims, "no set of victims was found");
  }
  for (int i : best.set) {
    choice.victims.push_back({opts[i].c->id, opts[i].kind, opts[i].lost});
    choice.lost_ms += opts[i].lost;
  }
  std::sort(choice.victims.begin(), choice.victims.end(),
            [](const Victim& a, const Victim& b) { return a.id < b.id; });
  return choice;
}

std::optional<PreemptionInput> InputFromCore(
    const PlacementCore& core, JobId waiting,
    const std::vector<Displacement>& displaced, TimeMs now,
    const RunningFactsFn& facts) {
  std::optional<PlacementSnapshot> snap = core.PreemptionSnapshot(waiting, now);
  if (!snap) return std::nullopt;
  PreemptionInput in;
  in.job.id = snap->job.id;
  in.job.user = snap->job.user;
  in.job.priority = snap->job.priority;
  in.job.pool = snap->job.pool;
  in.job.max_nodes = snap->job.max_nodes;
  in.job.displaced = displaced;
  in.within_limit = snap->within_limit;
  in.user_slots = snap->user_slots;
  in.user_slot_limit = snap->user_slot_limit;
  in.workers = std::move(snap->workers);
  in.usage = std::move(snap->active_usage);
  in.running.reserve(snap->running.size());
  in.higher_running = snap->higher;
  for (RunningSlots& r : snap->running) {
    PreemptionCandidate& c = in.running.emplace_back();
    c.id = r.id;
    c.user = std::move(r.user);
    c.priority = r.priority;
    c.parts = std::move(r.parts);
    c.started = r.start;
    if (facts) {
      const RunningFacts f = facts(c.id);
      c.preemptible = f.preemptible;
      c.checkpoint = f.checkpoint;
    }
  }
  return in;
}

PreemptionChoice ChooseVictims(const PlacementCore& core, JobId waiting,
                               const std::vector<Displacement>& displaced,
                               const PreemptionPolicy& policy, TimeMs now,
                               const RunningFactsFn& facts) {
  if (policy.mode == PreemptionMode::kOff) {
    return None(NoPreemption::kOff, "preemption is off on its profile");
  }
  std::optional<PreemptionInput> in =
      InputFromCore(core, waiting, displaced, now, facts);
  if (!in) return None(NoPreemption::kNeverFits, "it is not queued");
  PreemptionChoice choice = ChooseVictims(*in, policy, now);
  if (!choice.victims.empty() &&
      !core.FitsWithReleased(waiting, choice.ids())) {
    return None(NoPreemption::kCoreRefused,
                "the core would not place it on the victims' slots");
  }
  return choice;
}

PreemptionChoice ChooseVictimsOnNodes(const NodePreemptionInput& input,
                                      const PreemptionPolicy& policy,
                                      TimeMs now) {
  const int per_node = std::max(1, input.per_node);
  PreemptionInput in;
  in.job = input.job;
  in.job.pool = std::max(1, input.nodes) * per_node;
  in.job.max_nodes = std::max(1, input.nodes);
  in.usage = input.usage;
  std::unordered_map<std::string, WorkerId> id_of;
  for (const NodeRoom& node : input.room) {
    // A node short of the share never takes the job.
    if (node.units < per_node || id_of.contains(node.name)) continue;
    const WorkerId id = static_cast<WorkerId>(in.workers.size()) + 1;
    id_of[node.name] = id;
    in.workers.push_back({id, per_node, std::clamp(node.free, 0, per_node)});
  }
  in.running.reserve(input.running.size());
  for (const NodeCandidate& r : input.running) {
    PreemptionCandidate& c = in.running.emplace_back(r.job);
    c.parts.clear();
    for (const std::string& name : r.nodes) {
      auto it = id_of.find(name);
      if (it == id_of.end() || r.per_node <= 0) continue;
      Part part;
      part.worker = it->second;
      for (int d = 0; d < r.per_node; ++d) part.devices.push_back(d);
      c.parts.push_back(std::move(part));
    }
  }
  return ChooseVictims(in, policy, now);
}

std::string DurationText(TimeMs ms) {
  if (ms < 1000) return absl::StrCat(std::max<TimeMs>(0, ms), "ms");
  const int64_t total = (ms + 999) / 1000;  // "at most": round up
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  std::string out;
  if (h > 0) absl::StrAppend(&out, h, "h");
  if (m > 0) absl::StrAppend(&out, m, "m");
  if (s > 0 || out.empty()) absl::StrAppend(&out, s, "s");
  return out;
}

std::string PreemptingText(const std::vector<JobId>& victims, TimeMs grace_ms) {
  constexpr size_t kNamed = 4;  // jobs named before "and N more"
  std::vector<JobId> ids = victims;
  std::sort(ids.begin(), ids.end());
  std::string list;
  if (ids.size() == 1) {
    list = absl::StrCat("job ", ids[0]);
  } else if (ids.size() <= kNamed + 1) {
    const JobId last = ids.back();
    ids.pop_back();
    list = absl::StrCat("jobs ", absl::StrJoin(ids, ", "), " and ", last);
  } else {
    list = absl::StrCat(
        "jobs ",
        absl::StrJoin(ids.begin(), ids.begin() + static_cast<long>(kNamed),
                      ", "),
        " and ", ids.size() - kNamed, " more");
  }
  return absl::StrCat("preempting ", list, " (checkpointing; at most ",
                      DurationText(grace_ms), ")");
}

}  // namespace dlbatch::scheduler
