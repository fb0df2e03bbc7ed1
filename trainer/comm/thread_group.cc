// Ranks as threads of one process: collectives over shared memory.
#include "trainer/comm/thread_group.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace dlbatch::trainer {

// One rank's communicator: the group's collectives, as rank `rank_`.
class ThreadGroup::Member : public Communicator {
 public:
  Member(ThreadGroup* group, int rank) : g_(*group), rank_(rank) {}
  int rank() const override { return g_.first_rank_ + rank_; }
  int size() const override { return g_.world_; }
  bool splits_batch() const override { return g_.splits_batch_; }

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
    const bool across = g_.spans_processes();
    if (across && rank_ == 0 &&
        g_.staging_.size() < static_cast<size_t>(total)) {
      g_.staging_.resize(total);
    }
    RETURN_IF_ERROR(Publish(&sums, total, 0, "an allreduce"));
    const std::vector<Slot>& s = g_.slots_;
    // This rank's share of range j: whole cache lines of floats, the last
    // rank's taking the rest.
    const auto share = [&](size_t j, int64_t* lo, int64_t* hi) {
      const int64_t count = sums[j].count;
      const auto bound = [&](int k) -> int64_t {
        if (k == g_.size_) return count;
        return count * k / g_.size_ / 16 * 16;
      };
      *lo = bound(rank_);
      *hi = bound(rank_ + 1);
      return *hi > *lo;
    };
    // The threads' sum of each share: in place in rank 0's buffers, or,
    // spanning processes, into the staging buffer for the processes'
    // allreduce (in the same order: the same bits).
    int64_t offset = 0;
    for (size_t j = 0; j < sums.size(); offset += sums[j].count, ++j) {
      int64_t lo, hi;
      if (!share(j, &lo, &hi)) continue;
      const float* first = (*s[0].ranges)[j].data;
      float* out =
          across ? g_.staging_.data() + offset : (*s[0].ranges)[j].data;
      if (across) std::memcpy(out + lo, first + lo, (hi - lo) * sizeof(float));
      for (int k = 1; k < g_.size_; ++k) {
        const float* in = (*s[k].ranges)[j].data;
        for (int64_t i = lo; i < hi; ++i) out[i] += in[i];
      }
      if (across) continue;
      for (int k = 1; k < g_.size_; ++k) {
        std::memcpy((*s[k].ranges)[j].data + lo, out + lo,
                    (hi - lo) * sizeof(float));
      }
    }
    if (across) {
      RETURN_IF_ERROR(g_.Meet("the threads' sum of an allreduce"));
      if (rank_ == 0) {
        RETURN_IF_ERROR(g_.Between([&](Communicator* between) {
          return between->AllreduceSum(g_.staging_.data(), total);
        }));
      }
      RETURN_IF_ERROR(g_.Meet("the processes' allreduce"));
      offset = 0;
      for (size_t j = 0; j < sums.size(); offset += sums[j].count, ++j) {
        int64_t lo, hi;
        if (!share(j, &lo, &hi)) continue;
        const float* sum = g_.staging_.data() + offset;
        for (int k = 0; k < g_.size_; ++k) {
          std::memcpy((*s[k].ranges)[j].data + lo, sum + lo,
                      (hi - lo) * sizeof(float));
        }
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
    if (root < 0 || root >= g_.world_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "broadcast root ", root, " is not a rank of ", g_.world_));
    }
    RETURN_IF_ERROR(WaitAll());
    const std::vector<Range> one = {{data, count}};
    RETURN_IF_ERROR(Publish(&one, count, root, "a broadcast"));
    // The root's place in this process; outside it, rank 0 brings the
    // root's data from the processes' broadcast, and the others copy it
    // from rank 0.
    const int local_root = root - g_.first_rank_;
    const bool here = local_root >= 0 && local_root < g_.size_;
    int from = local_root;
    if (g_.spans_processes()) {
      if (rank_ == 0) {
        if (here && local_root != 0 && count > 0) {
          std::memcpy(data, (*g_.slots_[local_root].ranges)[0].data,
                      count * sizeof(float));
        }
        RETURN_IF_ERROR(g_.Between([&](Communicator* between) {
          return between->Broadcast(data, count, g_.ProcessOf(root));
        }));
      }
      RETURN_IF_ERROR(g_.Meet("the processes' broadcast"));
      from = 0;
    }
    if (rank_ != from && !(here && rank_ == local_root) && count > 0) {
      std::memcpy(data, (*g_.slots_[from].ranges)[0].data,
                  count * sizeof(float));
    }
    return g_.Meet("the end of a broadcast");
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(WaitAll());
    if (!g_.spans_processes()) return g_.Meet("a barrier");
    RETURN_IF_ERROR(g_.Meet("a barrier"));
    if (rank_ == 0) {
      RETURN_IF_ERROR(
          g_.Between([](Communicator* between) { return between->Barrier(); }));
    }
    return g_.Meet("the processes' barrier");
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
    {
      absl::MutexLock lock(&g_.mu_);
      if (!g_.abort_status_.ok()) return g_.abort_status_;
      g_.keys_[key] = value;
      g_.cv_.SignalAll();
    }
    if (g_.span_.store != nullptr) return g_.span_.store->Set(key, value);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    Rendezvous* const shared = g_.span_.store;
    while (true) {
      {
        absl::MutexLock lock(&g_.mu_);
        if (!g_.abort_status_.ok()) return g_.abort_status_;
        if (auto it = g_.keys_.find(key); it != g_.keys_.end()) {
          return it->second;
        }
        if (shared == nullptr) {
          if (g_.cv_.WaitWithDeadline(&g_.mu_, deadline) &&
              g_.keys_.count(key) == 0 && g_.abort_status_.ok()) {
            return absl::DeadlineExceededError(
                absl::StrCat("no rank set \"", key, "\" within ",
                             absl::FormatDuration(timeout)));
          }
          continue;
        }
      }
      // Another process's rank may set it: asked in slices, so that an
      // abort ends the wait.
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<std::string> value =
          shared->Get(key, std::max(absl::ZeroDuration(),
                                    std::min(left, absl::Milliseconds(500))));
      if (value.ok() || !absl::IsDeadlineExceeded(value.status()) ||
          left <= absl::Milliseconds(500)) {
        return value;
      }
    }
  }

 private:
  ThreadGroup& g_;
};

ThreadGroup::ThreadGroup(int size, absl::Duration timeout, bool splits_batch)
    : ThreadGroup(size, timeout, splits_batch, Span()) {}

ThreadGroup::ThreadGroup(int size, absl::Duration timeout, bool splits_batch,
                         Span span)
    : size_(std::max(size, 1)),
      timeout_(timeout),
      splits_batch_(splits_batch),
      span_(std::move(span)),
      first_rank_(span_.between != nullptr
                      ? span_.first_ranks.at(span_.between->rank())
                      : 0),
      world_(span_.between != nullptr ? span_.world : size_),
      slots_(size_) {
  for (int r = 0; r < size_; ++r) {
    members_.push_back(std::make_unique<Member>(this, r));
  }
  store_ = std::make_unique<Store>(this);
}

int ThreadGroup::ProcessOf(int rank) const {
  const auto after = std::upper_bound(span_.first_ranks.begin(),
                                      span_.first_ranks.end(), rank);
  return static_cast<int>(after - span_.first_ranks.begin()) - 1;
}

absl::Status ThreadGroup::Between(
    const std::function<absl::Status(Communicator*)>& collective) {
  absl::Status status = collective(span_.between);
  if (!status.ok()) Abort(status);
  return status;
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
