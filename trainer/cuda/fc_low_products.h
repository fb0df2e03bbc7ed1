// A fully connected layer in bf16 or fp16 (gpu_fc.cc) as cuBLAS products
// over low-precision copies: x (n, in) and the weights (units, in) cast
// with their rows padded to in_p, a multiple of 8 elements (so that every
// column of the column-major copies starts 16 bytes apart, as tensor cores
// load them), the weights' rows padded to units_p with zeros, and dy
// (n, units) cast with its rows padded to units_p. Results are float32
// arrays of the layer's own shapes. Column-major, X = x^T (in_p x n),
// W = w^T (in_p x units_p), DY = dy^T (units_p x n):
//
//   y^T (units x n)  = W^T X    over k = in_p (the padding adds zeros)
//   dx^T (in x n)    = W DY     over k = units_p
//   dw^T (in x units) = X DY^T  over k = n
//
// Plain C++ (no CUDA): gpu_elements_test runs these products on the host,
// with a reference product of cuBLAS's semantics, against the CPU backend.
#ifndef DLBATCH_TRAINER_CUDA_FC_LOW_PRODUCTS_H_
#define DLBATCH_TRAINER_CUDA_FC_LOW_PRODUCTS_H_

#include <cstdint>

#include "trainer/cuda/conv_lowering.h"  // MatrixProduct
#include "trainer/cuda/gpu_elements.h"   // CastGeometry

namespace dlbatch::trainer::gpu {

class FcLowProducts {
 public:
  // REQUIRES: in and units in [1, INT_MAX - 7].
  FcLowProducts(int64_t in, int units)
      : in_(static_cast<int>(in)),
        units_(units),
        in_p_(PadTo8(in_)),
        units_p_(PadTo8(units)) {}

  static int PadTo8(int v) { return (v + 7) / 8 * 8; }
  int in_p() const { return in_p_; }
  int units_p() const { return units_p_; }

  // The casts: x's and the weights' rows (the weights as `units` samples
  // into units_p), and dy's rows.
  CastGeometry InputRows() const { return {1, 1, in_, 1, 1, in_p_}; }
  CastGeometry GradientRows() const { return {1, 1, units_, 1, 1, units_p_}; }

  // a = the weights' copy, b = x's; c = y, after the bias (beta 1).
  MatrixProduct Forward(int n) const {
    return {true, false, units_, n, in_p_, in_p_, in_p_, units_};
  }
  // a = the weights' copy, b = dy's; c = dx.
  MatrixProduct BackwardData(int n) const {
    return {false, false, in_, n, units_p_, in_p_, units_p_, in_};
  }
  // a = x's copy, b = dy's; c = dw.
  MatrixProduct BackwardWeights(int n) const {
    return {false, true, in_, units_, n, in_p_, units_p_, in_};
  }

 private:
  int in_, units_, in_p_, units_p_;
};

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_FC_LOW_PRODUCTS_H_
