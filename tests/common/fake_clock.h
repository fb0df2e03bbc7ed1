// A Clock that moves only when a test moves it, so timeouts are tested
// without sleeping.
#ifndef DLBATCH_TESTS_COMMON_FAKE_CLOCK_H_
#define DLBATCH_TESTS_COMMON_FAKE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "common/clock.h"

namespace dlbatch {

// Thread-safe: the code under test may read it from its own threads while
// the test sets or advances it.
class FakeClock final : public Clock {
 public:
  // Arbitrary but realistic starting points (wall time in 2023).
  static constexpr int64_t kStartNowMs = 1'700'000'000'000;
  static constexpr int64_t kStartMonotonicMs = 1'000'000;

  int64_t NowMs() const override { return now_ms_.load(); }
  int64_t MonotonicMs() const override { return monotonic_ms_.load(); }

  void SetNowMs(int64_t ms) { now_ms_.store(ms); }
  void SetMonotonicMs(int64_t ms) { monotonic_ms_.store(ms); }
  // Moves both clocks forward by `ms`.
  void Advance(int64_t ms) {
    now_ms_.fetch_add(ms);
    monotonic_ms_.fetch_add(ms);
  }

 private:
  std::atomic<int64_t> now_ms_{kStartNowMs};
  std::atomic<int64_t> monotonic_ms_{kStartMonotonicMs};
};

}  // namespace dlbatch

#endif  // DLBATCH_TESTS_COMMON_FAKE_CLOCK_H_
