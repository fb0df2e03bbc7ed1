// Tensor shapes of the trainer. Activations are 4-D, logically (N, C, H, W),
// and laid out channels-last (NHWC) in memory on every backend: element
// (n, h, w, c) is at ((n * H + h) * W + w) * C + c. A fully connected layer's
// output is (N, 1, 1, units). Channels-last is what oneDNN's and cuDNN's
// fastest kernels take and what the data files hold (H, W, C per image).
#ifndef DLBATCH_TRAINER_SHAPE_H_
#define DLBATCH_TRAINER_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {

// One sample's shape: height, width, channels. The batch size is passed
// separately, at every call, because the last validation batch is smaller.
struct Shape {
  int h = 0;
  int w = 0;
  int c = 0;

  int64_t size() const { return int64_t{h} * w * c; }
  bool operator==(const Shape&) const = default;
  // "[28, 28, 1]", in the job file's order.
  std::string ToString() const {
    return absl::StrCat("[", h, ", ", w, ", ", c, "]");
  }
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_SHAPE_H_
