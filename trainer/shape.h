// Tensor shapes of the trainer. Activations are 4-D, logically (N, C, H, W),
// and laid out channels-last (NHWC) in memory on every backend: element
// (n, h, w, c) is at ((n * H + h) * W + w) * C + c. A fully connected layer's
// output is (N, 1, 1, units). Channels-last is what oneDNN's and cuDNN's
// fastest kernels take and what the data files hold (H, W, C per image).
#ifndef DLBATCH_TRAINER_SHAPE_H_
#define DLBATCH_TRAINER_SHAPE_H_

#include "proto/sample_shape.h"

namespace dlbatch::trainer {

// One sample's shape: height, width, channels. The batch size is passed
// separately, at every call, because the last validation batch is smaller.
// The spec's own (proto/sample_shape.h), so that the layers are built to
// the shapes a job was checked against at submission.
using Shape = ::dlbatch::SampleShape;

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_SHAPE_H_
