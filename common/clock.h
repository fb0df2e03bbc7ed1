// Time behind an interface, so liveness and timeouts are tested with a fake
// clock instead of sleeps.
#ifndef DLBATCH_COMMON_CLOCK_H_
#define DLBATCH_COMMON_CLOCK_H_

#include <cstdint>

namespace dlbatch {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch (wall time, for records).
  virtual int64_t NowMs() const = 0;
  // Milliseconds on a monotonic clock (for timeouts).
  virtual int64_t MonotonicMs() const = 0;
};

// The real clock. Thread-safe.
class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override;
  int64_t MonotonicMs() const override;
  static SystemClock* Get();
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_CLOCK_H_
