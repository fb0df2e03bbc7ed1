// A convolution as matrix products, the way the GPU backend may run it
// (gpu_conv.cc) where that is faster than cuDNN's algorithms: the samples'
// patches (gpu_elements.h's PatchAt: a row per output position, a column
// per filter element in OHWI order) times the filters is the output, as a
// fully connected layer over the patches. With rows P (output positions),
// columns R (kh * kw * c) and filters K:
//
//   y (P x K)         = patches (P x R) w^T (R x K)       then the bias
//   dpatches (P x R)  = dy (P x K) w (K x R)              then fold (FoldedAt)
//   dw (K x R)       += dy^T (K x P) patches (P x R)      over chunks
//
// Backward weights may also split a chunk's rows into groups of whole
// samples, one product each, all at once (a strided batch), and sum the
// groups' parts after (in a fixed order): a filter gradient is a small
// matrix over many rows (LeNet's first convolution at batch 1024: 20 x 25
// over 589,824), which one product computes with few blocks of threads.
//
// The patches of a batch can be large (LeNet's second convolution at batch
// 1024: 131 MB), so samples go in chunks whose patches fit a workspace cap;
// backward weights adds the chunks' products in order. A 1x1 window with
// stride 1 and no padding needs no patches: they are x itself.
//
// Plain C++ (no CUDA): gpu_elements_test runs the whole scheme on the host
// against the CPU backend, with a reference product of cuBLAS's semantics.
#ifndef DLBATCH_TRAINER_CUDA_CONV_LOWERING_H_
#define DLBATCH_TRAINER_CUDA_CONV_LOWERING_H_

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "trainer/backend.h"
#include "trainer/cuda/gpu_elements.h"

namespace dlbatch::trainer::gpu {

// C (m x n, leading dimension ldc) = op(A) (m x k) op(B) (k x n), all
// column-major, as cublasSgemm takes them; op transposes where `trans_*`.
// A row-major (r x c) matrix is a column-major (c x r) one.
struct MatrixProduct {
  bool trans_a, trans_b;
  int m, n, k, lda, ldb, ldc;
};

class ConvLowering {
 public:
  // `max_bytes`: the most the patches of one chunk may take (at least one
  // sample's, whatever it says).
  ConvLowering(const ConvDesc& d, size_t max_bytes)
      : g_(MakeConvGeometry(d.in.h, d.in.w, d.in.c, d.kh, d.kw, d.stride_h,
                            d.stride_w, d.pad.top, d.pad.left, d.out.h,
                            d.out.w)),
        filters_(d.filters),
        columns_(d.kh * d.kw * d.in.c),
        positions_(int64_t{d.out.h} * d.out.w),
        identity_(d.kh == 1 && d.kw == 1 && d.stride_h == 1 &&
                  d.stride_w == 1 && d.pad.top == 0 && d.pad.left == 0 &&
                  d.pad.bottom == 0 && d.pad.right == 0) {
    // Rows of a chunk are a product's n or k: an int.
    int64_t chunk =
        std::max<int64_t>(1, INT_MAX / std::max<int64_t>(positions_, 1));
    if (!identity_) {
      const int64_t sample_bytes =
          positions_ * columns_ * static_cast<int64_t>(sizeof(float));
      chunk = std::min<int64_t>(
          chunk, std::max<int64_t>(1, static_cast<int64_t>(max_bytes) /
                                          std::max<int64_t>(sample_bytes, 1)));
    }
    chunk_ = static_cast<int>(std::min<int64_t>(chunk, INT_MAX));
  }

  const ConvGeometry& geometry() const { return g_; }
  // The patches are x (no unfolding, no workspace).
  bool identity() const { return identity_; }
  // Samples per chunk.
  int chunk() const { return chunk_; }
  // Elements of the patches of `samples` samples.
  int64_t PatchElements(int samples) const {
    return samples * positions_ * columns_;
  }
  // Workspace for the patches of batches of up to n samples (a multiple of
  // 256 bytes: the groups' parts may follow).
  size_t WorkspaceBytes(int n) const {
    if (identity_) return 0;
    const size_t bytes =
        static_cast<size_t>(PatchElements(std::min(n, chunk_))) * sizeof(float);
    return (bytes + 255) / 256 * 256;
  }
  // Elements of the filters' gradient (K x R).
  int64_t FilterElements() const { return int64_t{filters_} * columns_; }
  // Workspace for backward weights' parts in `groups` groups (none for 1).
  size_t PartsBytes(int groups) const {
    return groups > 1
               ? static_cast<size_t>(groups * FilterElements()) * sizeof(float)
               : 0;
  }
  // The groups a chunk of `samples` samples splits into for backward
  // weights: the largest power of two at most `most` that divides samples.
  static int Groups(int samples, int most) {
    int groups = 1;
    while (groups * 2 <= most && samples % (groups * 2) == 0) groups *= 2;
    return groups;
  }
  // Rows of `samples` samples.
  int64_t Rows64(int samples) const { return samples * positions_; }

  // The products of a chunk of `samples` samples (rows = samples * oh * ow),
  // with A, B, C as named above each.
  // y = patches w^T: A = w, B = patches, C = y.
  MatrixProduct Forward(int samples) const {
    return {true,     false,    filters_, Rows(samples),
            columns_, columns_, columns_, filters_};
  }
  // dpatches = dy w: A = w, B = dy, C = dpatches.
  MatrixProduct BackwardData(int samples) const {
    return {false,    false,    columns_, Rows(samples),
            filters_, columns_, filters_, columns_};
  }
  // dw (+)= dy^T patches: A = patches, B = dy, C = dw. In groups: each
  // group's product, of `samples` samples per group; group g's A, B and C
  // start g * Rows64(samples) * R, g * Rows64(samples) * K and
  // g * FilterElements() elements in.
  MatrixProduct BackwardWeights(int samples) const {
    return {false,         true,     columns_, filters_,
            Rows(samples), columns_, filters_, columns_};
  }

 private:
  int Rows(int samples) const { return static_cast<int>(Rows64(samples)); }

  ConvGeometry g_;
  int filters_;
  int columns_;
  int64_t positions_;
  bool identity_;
  int chunk_ = 1;
};

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_CONV_LOWERING_H_
