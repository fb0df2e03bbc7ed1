// Where augmentation puts a sample: per axis, a reflection, a shift and the
// output positions that hold image pixels (the rest are fill). The batch
// loader draws it (data.h) and applies it on the host, or hands it with the
// sample's bytes to Backend::PrepareImages, which applies it on the device;
// both read the same placements, so they make the same images. Plain C++,
// included by nvcc too.
#ifndef DLBATCH_TRAINER_PLACEMENT_H_
#define DLBATCH_TRAINER_PLACEMENT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define DLBATCH_HOST_DEVICE __host__ __device__
#else
#define DLBATCH_HOST_DEVICE
#endif

namespace dlbatch::trainer {

struct AxisPlacement {
  int32_t reflect;  // 1: the axis is reversed, then shifted
  int32_t shift;    // output position p reads position p - shift
  int32_t lo, hi;   // output positions [lo, hi) hold pixels; 0 <= lo <= hi
};

// Height, then width. Trivially copyable: batches carry arrays of them to
// the device as they are.
struct SamplePlacement {
  AxisPlacement y, x;
};

// The source position that output position `p` (in [0, size)) reads, or -1
// where it is fill.
DLBATCH_HOST_DEVICE inline int SourceAt(const AxisPlacement& a, int p,
                                        int size) {
  if (p < a.lo || p >= a.hi) return -1;
  const int s = p - a.shift;
  return a.reflect != 0 ? size - 1 - s : s;
}

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_PLACEMENT_H_
