// Collectives between CPU replicas over Gloo's TCP transport.
//
// Gloo reports every failure by throwing (gloo::IoException for a dead or
// silent peer, gloo::EnforceNotMet for a broken invariant, ...). Nothing is
// allowed to escape this file: each entry point catches everything and
// returns a Status naming the collective, the rank and Gloo's message. After
// a failure Gloo's context is unusable (its pairs are closed or
// half-way through a transfer), so the communicator remembers the first
// error and refuses every later collective with it.
//
// Started allreduces (StartAllreduceSum) run on one worker thread of the
// communicator, first in first out: Gloo's context is not safe for
// concurrent collectives, and every rank must run them in one order. A
// blocking collective waits until that thread has run everything started
// before it, then runs on the caller's thread; so at any moment exactly one
// thread uses the context, and the order of collectives is the order they
// were called in, on every rank (synchronised batchnorm's allreduces inside
// backward included).
#include "trainer/comm/communicator_gloo.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/algorithm.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

// Thrown by the store adapter through Gloo's connect code and caught again
// in MakeGlooCommunicatorWith; the Status itself waits in the adapter.
class StoreFailed : public std::exception {
 public:
  const char* what() const noexcept override { return "rendezvous failed"; }
};

// Gloo's rendezvous::Store over our Rendezvous. Every key gets `prefix`, so
// several communicators of one job keep apart in one store. Gloo names the
// key holding rank N's addresses just "N" (next to its own "rank_N"); it is
// stored as "addresses_rank_N", so that a rank that never came is named as
// such in the rendezvous's timeout error.
class RendezvousStore : public gloo::rendezvous::Store {
 public:
  RendezvousStore(Rendezvous* rendezvous, std::string prefix,
                  absl::Duration timeout)
      : rendezvous_(rendezvous),
        prefix_(std::move(prefix)),
        timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(rendezvous_->Set(Key(key), std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = rendezvous_->Get(Key(key), timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    WaitUntil(keys, absl::Now() + timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    WaitUntil(keys,
              absl::Now() + std::min(timeout_, absl::FromChrono(timeout)));
  }

  // The first error the store met, OK if none.
  const absl::Status& error() const { return error_; }

 private:
  void WaitUntil(const std::vector<std::string>& keys, absl::Time deadline) {
    for (const std::string& key : keys) {
      absl::Duration left =
          std::max(deadline - absl::Now(), absl::ZeroDuration());
      Check(rendezvous_->Get(Key(key), left).status());
    }
  }

  std::string Key(const std::string& key) const {
    const bool is_rank =
        !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
    return is_rank ? absl::StrCat(prefix_, "addresses_rank_", key)
                   : prefix_ + key;
  }

  void Check(const absl::Status& status) {
    if (status.ok()) return;
    if (error_.ok()) error_ = status;
    throw StoreFailed();
  }

  Rendezvous* const rendezvous_;
  const std::string prefix_;
  const absl::Duration timeout_;
  absl::Status error_;
};

// Turns whatever Gloo threw into a Status. Call only from a catch block.
absl::Status StatusFromCurrentException(const std::string& context) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    // Gloo says "Timed out", "Read timeout", "Connect timeout"... when a
    // peer stayed silent for the whole timeout; anything else is a closed or
    // reset connection: the peer is gone.
    const std::string what = e.what();
    const std::string lower = absl::AsciiStrToLower(what);
    if (absl::StrContains(lower, "timed out") ||
        absl::StrContains(lower, "timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(
          context, ": a peer did not answer in time (", what, ")"));
    }
    return absl::UnavailableError(
        absl::StrCat(context, ": a peer is gone (", what, ")"));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  } catch (...) {
    return absl::UnknownError(absl::StrCat(context, ": unknown exception"));
  }
}

void SumFloats(void* out, const void* a, const void* b, size_t n) {
  float* o = static_cast<float*>(out);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// died would raise SIGPIPE and kill this rank too, instead of failing the
// collective. Ignore it, unless the program installed a handler of its own.
void IgnoreSigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(GlooAllreduce algorithm,
                   std::shared_ptr<gloo::Context> context)
      : algorithm_(algorithm), context_(std::move(context)) {}

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  // Allreduces still queued are dropped (their callers broke the contract
  // by not waiting); the one running finishes or times out first.
  ~GlooCommunicator() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      queue_.clear();
    }
    changed_.SignalAll();
    if (worker_.joinable()) worker_.join();
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllreduceSum(float* data, int64_t count) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status bad = CheckBuffer("allreduce", data, count); !bad.ok()) {
      return bad;
    }
    Drain();
    return Allreduce(data, count);
  }

  absl::Status StartAllreduceSum(float* data, int64_t count) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status bad = CheckBuffer("allreduce", data, count); !bad.ok()) {
      return bad;
    }
    if (count == 0) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      if (!worker_.joinable()) worker_ = std::thread([this] { Work(); });
      queue_.push_back({data, count});
    }
    changed_.SignalAll();
    return absl::OkStatus();
  }

  absl::Status WaitAll() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    AwaitIdle();
    absl::Status first = std::move(started_error_);
    started_error_ = absl::OkStatus();
    return first;
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status bad = CheckBuffer("broadcast", data, count); !bad.ok()) {
      return bad;
    }
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of ", size()));
    }
    Drain();
    return Run(absl::StrCat("broadcast of ", count, " floats from rank ", root),
               [&] {
                 if (count == 0) return;
                 gloo::BroadcastOptions opts(context_);
                 opts.setOutput(data, static_cast<size_t>(count));
                 opts.setRoot(root);
                 opts.setTag(NextTag());
                 gloo::broadcast(opts);
               });
  }

  absl::Status Barrier() override ABSL_LOCKS_EXCLUDED(mu_) {
    Drain();
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      gloo::barrier(opts);
    });
  }

 private:
  // An argument error leaves the communicator usable.
  static absl::Status CheckBuffer(const char* what, const float* data,
                                  int64_t count) {
    if (count < 0 || (count > 0 && data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " needs a buffer of count >= 0 floats; got count ",
                       count, data == nullptr ? " and no buffer" : ""));
    }
    return absl::OkStatus();
  }

  // One started allreduce, waiting for the worker.
  struct Started {
    float* data;
    int64_t count;
  };

  // The worker thread: runs started allreduces in order until stopped.
  void Work() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      while (!stopping_ && queue_.empty()) changed_.Wait(&mu_);
      if (stopping_) return;
      const Started next = queue_.front();
      queue_.pop_front();
      running_ = true;
      mu_.Unlock();
      absl::Status status = Allreduce(next.data, next.count);
      mu_.Lock();
      running_ = false;
      if (started_error_.ok()) started_error_ = std::move(status);
      changed_.SignalAll();
    }
  }

  // Returns once everything started before has run: the caller's thread
  // may use the context (the mutex hands over what the worker wrote).
  void Drain() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    AwaitIdle();
  }

  // Returns once no allreduce is queued or running; mu_ stays held.
  void AwaitIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.AssertHeld();
    while (!queue_.empty() || running_) changed_.Wait(&mu_);
  }

  // REQUIRES: the calling thread is the only one using the context.
  absl::Status Allreduce(float* data, int64_t count) {
    return Run(absl::StrCat("allreduce of ", count, " floats"), [&] {
      if (count == 0) return;
      if (IsClassic() && count <= INT_MAX) {
        RunClassic(data, count);
        return;
      }
      gloo::AllreduceOptions opts(context_);
      opts.setAlgorithm(algorithm_ == GlooAllreduce::kUnifiedBcube
                            ? gloo::AllreduceOptions::Algorithm::BCUBE
                            : gloo::AllreduceOptions::Algorithm::RING);
      opts.setOutput(data, static_cast<size_t>(count));
      opts.setReduceFunction(&SumFloats);
      opts.setTag(NextTag());
      gloo::allreduce(opts);
    });
  }

  bool IsClassic() const {
    return algorithm_ != GlooAllreduce::kUnifiedRing &&
           algorithm_ != GlooAllreduce::kUnifiedBcube;
  }

  // Runs one collective; the first failure breaks the communicator for good.
  template <typename Fn>
  absl::Status Run(const std::string& what, Fn&& fn) {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " on rank ", rank(), " of ", size(),
                       ": the communicator failed earlier and cannot be used: ",
                       broken_.message()));
    }
    try {
      fn();
      return absl::OkStatus();
    } catch (...) {
      broken_ = StatusFromCurrentException(
          absl::StrCat(what, " on rank ", rank(), " of ", size()));
      return broken_;
    }
  }

  // Tags keep consecutive collectives' messages apart; every rank calls the
  // collectives in the same order, so the counters agree.
  uint32_t NextTag() { return next_tag_++; }

  // Gloo's older algorithms bind their buffer at construction (and register
  // it with the peers), so they are built once per element count over a
  // buffer of our own; the data is copied in and out. Gradient buckets
  // bring a few counts that recur every step, so each count keeps its
  // algorithm; past kMaxClassic counts the cache starts afresh. The counts
  // come in the same order on every rank, so every rank builds (and drops)
  // at the same call.
  void RunClassic(float* data, int64_t count) {
    constexpr size_t kMaxClassic = 16;
    auto it = classic_.find(count);
    if (it == classic_.end()) {
      if (classic_.size() >= kMaxClassic) classic_.clear();
      Classic& made = classic_[count];
      made.staging.assign(static_cast<size_t>(count), 0.0f);
      std::vector<float*> ptrs = {made.staging.data()};
      const int n = static_cast<int>(count);
      switch (algorithm_) {
        case GlooAllreduce::kRing:
          made.algorithm =
              std::make_unique<gloo::AllreduceRing<float>>(context_, ptrs, n);
          break;
        case GlooAllreduce::kRingChunked:
          made.algorithm = std::make_unique<gloo::AllreduceRingChunked<float>>(
              context_, ptrs, n);
          break;
        default:
          made.algorithm =
              std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context_,
                                                                      ptrs, n);
      }
      it = classic_.find(count);
    }
    Classic& classic = it->second;
    std::memcpy(classic.staging.data(), data, sizeof(float) * count);
    classic.algorithm->run();
    std::memcpy(data, classic.staging.data(), sizeof(float) * count);
  }

  struct Classic {
    std::unique_ptr<gloo::Algorithm> algorithm;
    std::vector<float> staging;
  };

  const GlooAllreduce algorithm_;
  std::shared_ptr<gloo::Context> context_;
  // Used by one thread at a time: the worker while it runs an allreduce,
  // the caller's thread after Drain().
  absl::Status broken_;
  uint32_t next_tag_ = 0;
  std::map<int64_t, Classic> classic_;

  absl::Mutex mu_;
  absl::CondVar changed_;  // queue_, running_ or stopping_
  std::deque<Started> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the worker is busy
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status started_error_ ABSL_GUARDED_BY(mu_);  // for WaitAll
  // Started by the first StartAllreduceSum; joined by the destructor.
  std::thread worker_ ABSL_GUARDED_BY(mu_);
};

// Finds this communicator's number: the first n for which this rank has not
// yet joined communicator n in this store. Every rank makes its
// communicators in the same order, so every rank finds the same n.
absl::StatusOr<int> NextGeneration(Rendezvous* rendezvous, int rank) {
  for (int n = 0; n < 1000000; ++n) {
    absl::StatusOr<std::string> seen = rendezvous->Get(
        absl::StrCat("gloo/", n, "/member_", rank), absl::ZeroDuration());
    if (seen.ok()) continue;
    if (absl::IsDeadlineExceeded(seen.status())) return n;
    return seen.status();
  }
  return absl::ResourceExhaustedError("a million communicators in one store");
}

}  // namespace

const char* GlooAllreduceName(GlooAllreduce algorithm) {
  switch (algorithm) {
    case GlooAllreduce::kRing:
      return "ring";
    case GlooAllreduce::kRingChunked:
      return "ring_chunked";
    case GlooAllreduce::kHalvingDoubling:
      return "halving_doubling";
    case GlooAllreduce::kUnifiedRing:
      return "allreduce(ring)";
    case GlooAllreduce::kUnifiedBcube:
      return "allreduce(bcube)";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicatorWith(
    GlooAllreduce algorithm, Rendezvous* rendezvous, int rank, int size,
    const std::string& host, absl::Duration timeout) {
  if (rendezvous == nullptr) {
    return absl::InvalidArgumentError("Gloo communicator needs a rendezvous");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not one of ", size, " ranks"));
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(
        "Gloo communicator needs a host to bind to, e.g. 127.0.0.1");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gloo timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  if (size == 1) return MakeSoloCommunicator();

  const std::string where = absl::StrCat("rank ", rank, " of ", size);
  absl::StatusOr<int> generation = NextGeneration(rendezvous, rank);
  if (!generation.ok()) {
    return absl::Status(generation.status().code(),
                        absl::StrCat(where, " joining the rendezvous: ",
                                     generation.status().message()));
  }
  absl::Status joined = rendezvous->Set(
      absl::StrCat("gloo/", *generation, "/member_", rank), host);
  if (!joined.ok()) {
    return absl::Status(
        joined.code(),
        absl::StrCat(where, " joining the rendezvous: ", joined.message()));
  }

  IgnoreSigpipe();
  RendezvousStore store(rendezvous, absl::StrCat("gloo/", *generation, "/"),
                        timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(absl::ToChronoMilliseconds(timeout));
    context->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(algorithm, std::move(context)));
  } catch (...) {
    const std::string context = absl::StrCat(where, " connecting on ", host);
    if (!store.error().ok()) {
      return absl::Status(store.error().code(),
                          absl::StrCat(context, ": ", store.error().message()));
    }
    return StatusFromCurrentException(context);
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    Rendezvous* rendezvous, int rank, int size, const std::string& host,
    absl::Duration timeout) {
  return MakeGlooCommunicatorWith(kDefaultGlooAllreduce, rendezvous, rank, size,
                                  host, timeout);
}

}  // namespace dlbatch::trainer
