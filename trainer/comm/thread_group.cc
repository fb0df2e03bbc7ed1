// Ranks as threads of one process: collectives over shared memory.
#include "trainer/comm/thread_group.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace dlbatch::trainer {

// One rank's communicator: the group's collectives, as rank `rank_`.
class ThreadGroup::Member : public Communicator {
 public:
  Member(ThreadGroup* group, int rank) : g_(*group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size_; }
  bool splits_batch() const override { return true; }

  // Started allreduces wait for WaitAll (or the next collective), which
  // sums them all between one pair of meetings: a step's buckets and loss
  // sums cost two meetings, not two each.
  absl::Status StartAllreduceSum(float* data, int64_t count) override {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective over a negative count ", count));
    }
    started_.push_back({data, count});
    return absl::OkStatus();
  }

  absl::Status WaitAll() override {
    if (started_.empty()) return absl::OkStatus();
    const std::vector<Range> sums = std::move(started_);
    started_.clear();
    int64_t total = 0;
    for (const Range& r : sums) total += r.count;
    RETURN_IF_ERROR(Publish(&sums, total, 0, "an allreduce"));
    const std::vector<Slot>& s = g_.slots_;
    for (size_t j = 0; j < sums.size(); ++j) {
      const int64_t count = sums[j].count;
      // This rank's share of each: whole cache lines of floats, the last
      // rank's taking the rest.
      const auto bound = [&](int k) -> int64_t {
        if (k == g_.size_) return count;
        return count * k / g_.size_ / 16 * 16;
      };
      const int64_t lo = bound(rank_), hi = bound(rank_ + 1);
      if (hi <= lo) continue;
      float* out = (*s[0].ranges)[j].data;
      for (int k = 1; k < g_.size_; ++k) {
        const float* in = (*s[k].ranges)[j].data;
        for (int64_t i = lo; i < hi; ++i) out[i] += in[i];
      }
      for (int k = 1; k < g_.size_; ++k) {
        std::memcpy((*s[k].ranges)[j].data + lo, out + lo,
                    (hi - lo) * sizeof(float));
      }
    }
    // No rank goes on (and writes its buffers) while another reads them.
    return g_.Meet("the end of an allreduce");
  }

  absl::Status AllreduceSum(float* data, int64_t count) override {
    RETURN_IF_ERROR(StartAllreduceSum(data, count));
    return WaitAll();
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    if (root < 0 || root >= g_.size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "broadcast root ", root, " is not a rank of ", g_.size_));
    }
    RETURN_IF_ERROR(WaitAll());
    const std::vector<Range> one = {{data, count}};
    RETURN_IF_ERROR(Publish(&one, count, root, "a broadcast"));
    if (rank_ != root && count > 0) {
      std::memcpy(data, (*g_.slots_[root].ranges)[0].data,
                  count * sizeof(float));
    }
    return g_.Meet("the end of a broadcast");
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(WaitAll());
    return g_.Meet("a barrier");
  }

 private:
  // Publishes this rank's buffers and meets the others; checks that every
  // rank called the same collective over as many elements.
  absl::Status Publish(const std::vector<Range>* ranges, int64_t count,
                       int root, const char* what) {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective over a negative count ", count));
    }
    g_.slots_[rank_] = Slot{ranges, count, root};
    RETURN_IF_ERROR(g_.Meet(what));
    for (int k = 0; k < g_.size_; ++k) {
      const Slot& other = g_.slots_[k];
      bool same = other.count == count && other.root == root &&
                  other.ranges->size() == ranges->size();
      for (size_t j = 0; same && j < ranges->size(); ++j) {
        same = (*other.ranges)[j].count == (*ranges)[j].count;
      }
      if (!same) {
        absl::Status mismatch = absl::InternalError(absl::StrCat(
            what, ": rank ", rank_, " has ", ranges->size(), " buffers of ",
            count, " elements (root ", root, ") where rank ", k, " has ",
            other.ranges->size(), " of ", other.count, " (root ", other.root,
            "); the ranks' collectives differ"));
        g_.Abort(mismatch);
        return mismatch;
      }
    }
    return absl::OkStatus();
  }

  ThreadGroup& g_;
  const int rank_;
  std::vector<Range> started_;  // StartAllreduceSum's, until WaitAll
};

// The ranks' key-value store, in memory.
class ThreadGroup::Store : public Rendezvous {
 public:
  explicit Store(ThreadGroup* group) : g_(*group) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&g_.mu_);
    if (!g_.abort_status_.ok()) return g_.abort_status_;
    g_.keys_[key] = value;
    g_.cv_.SignalAll();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&g_.mu_);
    while (true) {
      if (!g_.abort_status_.ok()) return g_.abort_status_;
      if (auto it = g_.keys_.find(key); it != g_.keys_.end()) {
        return it->second;
      }
      if (g_.cv_.WaitWithDeadline(&g_.mu_, deadline) &&
          g_.keys_.count(key) == 0 && g_.abort_status_.ok()) {
        return absl::DeadlineExceededError(
            absl::StrCat("no rank set \"", key, "\" within ",
                         absl::FormatDuration(timeout)));
      }
    }
  }

 private:
  ThreadGroup& g_;
};

ThreadGroup::ThreadGroup(int size, absl::Duration timeout)
    : size_(std::max(size, 1)), timeout_(timeout), slots_(size_) {
  for (int r = 0; r < size_; ++r) {
    members_.push_back(std::make_unique<Member>(this, r));
  }
  store_ = std::make_unique<Store>(this);
}

ThreadGroup::~ThreadGroup() = default;

Communicator* ThreadGroup::communicator(int rank) {
  return members_.at(rank).get();
}

Rendezvous* ThreadGroup::rendezvous() { return store_.get(); }

void ThreadGroup::Abort(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (abort_status_.ok()) {
    abort_status_ =
        why.ok() ? absl::AbortedError("the ranks' group was ended") : why;
  }
  aborting_.store(true, std::memory_order_release);
  cv_.SignalAll();
}

absl::Status ThreadGroup::aborted() const {
  absl::MutexLock lock(&mu_);
  return abort_status_;
}

absl::Status ThreadGroup::Meet(const char* what) {
  if (aborting_.load(std::memory_order_acquire)) return aborted();
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    // The last to arrive opens the barrier; no rank arrives at the next
    // one before it sees the new generation.
    arrived_.store(0, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    generation_.store(generation + 1, std::memory_order_release);
    cv_.SignalAll();
    return absl::OkStatus();
  }
  // Spin for up to 50 us: the ranks of a balanced step arrive that close.
  const absl::Time spin_until = absl::Now() + absl::Microseconds(50);
  for (int i = 0;; ++i) {
    if (generation_.load(std::memory_order_acquire) != generation) {
      return absl::OkStatus();
    }
    if (aborting_.load(std::memory_order_acquire)) return aborted();
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if ((i & 63) == 63 && absl::Now() > spin_until) break;
  }
  const absl::Time deadline = absl::Now() + timeout_;
  absl::MutexLock lock(&mu_);
  while (generation_.load(std::memory_order_acquire) == generation) {
    if (!abort_status_.ok()) return abort_status_;
    if (cv_.WaitWithDeadline(&mu_, deadline) &&
        generation_.load(std::memory_order_acquire) == generation &&
        abort_status_.ok()) {
      abort_status_ = absl::DeadlineExceededError(
          absl::StrCat("a rank waited ", absl::FormatDuration(timeout_),
                       " for the others at ", what, "; a rank stopped coming"));
      aborting_.store(true, std::memory_order_release);
      cv_.SignalAll();
      return abort_status_;
    }
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::trainer
