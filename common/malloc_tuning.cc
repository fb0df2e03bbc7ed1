#include "common/malloc_tuning.h"

#include <malloc.h>

namespace dlbatch {

void KeepChunkBuffersInProcess() {
  // Setting either turns off glibc's sliding thresholds, which start at
  // 128 KiB and 256 KiB; 32 MiB is the most a thread's arena takes.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace dlbatch
