// The shapes of one sample and of a layer's window: plain values, without
// protobuf, so that what the backends include (trainer/backend.h, and the
// GPU module built from it) needs nothing of the wire schema. The rules
// that make them from a spec are network_shapes.h's.
#ifndef DLBATCH_PROTO_SAMPLE_SHAPE_H_
#define DLBATCH_PROTO_SAMPLE_SHAPE_H_

#include <cstdint>
#include <string>

namespace dlbatch {

// One sample's shape: height, width, channels, in the job file's order.
// The trainer's activations of this shape are laid out channels-last
// (trainer/shape.h).
struct SampleShape {
  int h = 0;
  int w = 0;
  int c = 0;

  int64_t size() const { return int64_t{h} * w * c; }
  bool operator==(const SampleShape&) const = default;
  // "[28, 28, 1]"
  std::string ToString() const;
};

// Padding of a window (convolution, pooling); `same` resolves to an
// asymmetric one (the extra row/column at the bottom/right, as TensorFlow,
// MATLAB and ONNX's SAME_UPPER do).
struct WindowPadding {
  int top = 0, left = 0, bottom = 0, right = 0;
  bool operator==(const WindowPadding&) const = default;
  // Whether each side pads as its opposite (all cuDNN can describe).
  bool symmetric() const { return top == bottom && left == right; }
  bool negative() const {
    return top < 0 || left < 0 || bottom < 0 || right < 0;
  }
};

// What a layer makes of its inputs.
struct LayerShape {
  SampleShape out;
  // conv, maxpool, avgpool: the window resolved (stride 0 means 1 for conv
  // and `size` for pooling; `same` padding resolved); globalavgpool: a
  // window of the whole input. Other layers: left as here.
  int kh = 0, kw = 0, stride_h = 1, stride_w = 1;
  WindowPadding pad;
};

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_SAMPLE_SHAPE_H_
