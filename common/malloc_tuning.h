// The daemons and the CLI move blobs in 4 MiB chunks: gRPC's slices, the
// chunk messages and the staging buffers are allocated and freed once per
// chunk. glibc's defaults map such blocks fresh and hand freed ones back to
// the kernel (munmap, or madvise on a thread's arena), so every chunk paid
// page faults and TLB shootdowns: in a 1 GiB upload that was more than half
// the scheduler's CPU (bench/RESULTS.md, transfer_bench).
#ifndef DLBATCH_COMMON_MALLOC_TUNING_H_
#define DLBATCH_COMMON_MALLOC_TUNING_H_

namespace dlbatch {

// Keeps blocks up to 32 MiB in malloc's arenas and freed memory in the
// process up to 16 MiB per arena. Call once, first thing in main.
void KeepChunkBuffersInProcess();

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_MALLOC_TUNING_H_
