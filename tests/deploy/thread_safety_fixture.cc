// A lock violation on purpose, for thread_safety_test.sh: built with
// -DDLBATCH_VIOLATE, Peek reads a guarded member without its lock, which
// deploy/thread-safety.sh must fail on; without it the file is clean. No
// target builds it.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

class Counter {
 public:
  void Add() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++n_;
  }
  int Peek() ABSL_LOCKS_EXCLUDED(mu_) {
#ifdef DLBATCH_VIOLATE
    return n_;
#else
    absl::MutexLock lock(&mu_);
    return n_;
#endif
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter counter;
  counter.Add();
  return counter.Peek() == 1 ? 0 : 1;
}
