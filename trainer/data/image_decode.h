// Decoding one image file's bytes (PNG through libpng, JPEG through
// libjpeg-turbo) into 8-bit pixels of the channels a network takes, and
// bilinear resizing to its input. Pure functions of their arguments; safe
// to call from several threads at once.
#ifndef DLBATCH_TRAINER_DATA_IMAGE_DECODE_H_
#define DLBATCH_TRAINER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

// An image in memory: h rows of w pixels of c channels, HWC, 8 bits.
struct Image {
  int h = 0;
  int w = 0;
  int c = 0;
  std::vector<uint8_t> pixels;  // h * w * c
};

// The most pixels (width x height) an image may have: a damaged header
// must not make the decoder allocate what no real image needs.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// Decodes a PNG or a JPEG (told apart by their signatures, not by the file
// name) into `channels` channels: 1 (grey) or 3 (RGB). Colour becomes grey
// as luma (0.299 R + 0.587 G + 0.114 B, rounded); grey becomes colour by
// repeating it; an alpha channel is composited onto black; 16-bit PNGs are
// scaled to 8 bits. A corrupt or truncated image, or one of another kind,
// is a DataLossError (InvalidArgument for an unknown kind) saying what is
// wrong, without the file's name (the caller adds it).
absl::StatusOr<Image> DecodeImage(absl::string_view bytes, int channels);

// Resizes `in` to h x w (channels kept) by bilinear interpolation with
// half-pixel centres (PyTorch's interpolate(mode="bilinear",
// align_corners=False) without antialiasing), rounding to the nearest
// value, into `out` (h * w * in.c bytes). Of the same size: a copy.
void ResizeBilinear(const Image& in, int h, int w, uint8_t* out);

// DecodeImage, then ResizeBilinear to `shape` (whose c is 1 or 3), into
// `out` (shape.size() bytes).
absl::Status DecodeImageTo(absl::string_view bytes, const Shape& shape,
                           uint8_t* out);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_DATA_IMAGE_DECODE_H_
