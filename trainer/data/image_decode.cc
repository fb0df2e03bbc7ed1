// PNG through libpng's simplified API, JPEG through libjpeg(-turbo), and
// the conversions to a network's input: channels and size.
#include "trainer/data/image_decode.h"

// clang-format off: jpeglib.h needs <cstdio> first.
#include <jerror.h>
#include <jpeglib.h>

#include <cstdio>
// clang-format on
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {
namespace {

bool IsPng(absl::string_view b) {
  static constexpr char kSignature[] = "\x89PNG\r\n\x1a\n";
  return b.size() >= 8 && std::memcmp(b.data(), kSignature, 8) == 0;
}

bool IsJpeg(absl::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF &&
         static_cast<uint8_t>(b[1]) == 0xD8 &&
         static_cast<uint8_t>(b[2]) == 0xFF;
}

absl::Status TooLarge(int64_t w, int64_t h) {
  return absl::InvalidArgumentError(
      absl::StrCat("the image is ", w, "x", h, " pixels, more than the ",
                   kMaxImagePixels, " an image may have; shrink it"));
}

// --- PNG ---

absl::Status PngFailure(const png_image& image, absl::string_view stage) {
  return absl::DataLossError(absl::StrCat(
      "not a readable PNG (", stage, ": ", image.message,
      "); the file is corrupt or truncated: write or copy it again"));
}

absl::StatusOr<Image> DecodePng(absl::string_view bytes) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  // On failure the simplified API has freed what it allocated.
  if (png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()) ==
      0) {
    return PngFailure(image, "header");
  }
  const bool colour = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  if (int64_t{image.width} * image.height > kMaxImagePixels) {
    const absl::Status s = TooLarge(image.width, image.height);
    png_image_free(&image);
    return s;
  }
  // 8-bit grey or RGB: palettes expand, 16 bits scale down; alpha is
  // composited onto what the buffer holds (zeros: black).
  image.format = colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  Image out;
  out.h = static_cast<int>(image.height);
  out.w = static_cast<int>(image.width);
  out.c = colour ? 3 : 1;
  out.pixels.assign(PNG_IMAGE_SIZE(image), 0);
  if (png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr) ==
      0) {
    return PngFailure(image, "pixels");
  }
  return out;
}

// --- JPEG ---

// libjpeg reports errors through callbacks: a fatal one must not return, so
// it jumps back to DecodeJpegRaw's setjmp (which holds no C++ object that a
// jump would skip).
struct JpegErrors {
  jpeg_error_mgr manager;  // first: libjpeg holds a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegFatal(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// A warning means corrupt data that libjpeg would paper over (a truncated
// file decodes as grey below the cut): fatal here, except bytes between
// markers, which cameras write and which change no pixel.
void JpegMessage(j_common_ptr cinfo, int level) {
  if (level >= 0 || cinfo->err->msg_code == JWRN_EXTRANEOUS_DATA) return;
  JpegFatal(cinfo);
}

// Decodes into `out` (its fields set once the header is read); false with
// errors->message on failure. `channels`: 1 or 3.
bool DecodeJpegRaw(const uint8_t* data, size_t size, int channels,
                   JpegErrors* errors, Image* out) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->manager);
  errors->manager.error_exit = JpegFatal;
  errors->manager.emit_message = JpegMessage;
  errors->message[0] = '\0';
  if (setjmp(errors->jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (int64_t{cinfo.image_width} * cinfo.image_height > kMaxImagePixels) {
    out->w = static_cast<int>(cinfo.image_width);
    out->h = static_cast<int>(cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->h = static_cast<int>(cinfo.output_height);
  out->w = static_cast<int>(cinfo.output_width);
  out->c = cinfo.output_components;
  out->pixels.resize(static_cast<size_t>(out->h) * out->w * out->c);
  const size_t row_bytes = static_cast<size_t>(out->w) * out->c;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + cinfo.output_scanline * row_bytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

absl::StatusOr<Image> DecodeJpeg(absl::string_view bytes, int channels) {
  JpegErrors errors;
  Image out;
  if (!DecodeJpegRaw(reinterpret_cast<const uint8_t*>(bytes.data()),
                     bytes.size(), channels, &errors, &out)) {
    if (errors.message[0] == '\0') return TooLarge(out.w, out.h);
    return absl::DataLossError(absl::StrCat(
        "not a readable JPEG (", errors.message,
        "); the file is corrupt or truncated: write or copy it again"));
  }
  if (out.c != channels) {
    return absl::DataLossError(absl::StrCat("the JPEG decodes to ", out.c,
                                            " channels, not ", channels,
                                            "; convert it to RGB or grey"));
  }
  return out;
}

// --- Channels and size ---

Image ToChannels(Image in, int channels) {
  if (in.c == channels) return in;
  Image out;
  out.h = in.h;
  out.w = in.w;
  out.c = channels;
  const int64_t n = int64_t{in.h} * in.w;
  out.pixels.resize(n * channels);
  const uint8_t* src = in.pixels.data();
  uint8_t* dst = out.pixels.data();
  if (channels == 1) {  // RGB -> luma, as MATLAB's rgb2gray and JPEG's Y
    for (int64_t i = 0; i < n; ++i, src += 3) {
      dst[i] = static_cast<uint8_t>(
          (299 * src[0] + 587 * src[1] + 114 * src[2] + 500) / 1000);
    }
  } else {  // grey -> RGB
    for (int64_t i = 0; i < n; ++i, dst += 3) dst[0] = dst[1] = dst[2] = src[i];
  }
  return out;
}

// Where output position i of `out` samples an axis of `in` positions.
struct Tap {
  int lo = 0;
  int hi = 0;
  float t = 0;  // weight of hi
};

std::vector<Tap> Taps(int in, int out) {
  std::vector<Tap> taps(out);
  const double scale = static_cast<double>(in) / out;
  for (int i = 0; i < out; ++i) {
    double src = (i + 0.5) * scale - 0.5;
    if (src < 0) src = 0;
    Tap& tap = taps[i];
    tap.lo = std::min(static_cast<int>(src), in - 1);
    tap.hi = std::min(tap.lo + 1, in - 1);
    tap.t = static_cast<float>(src - tap.lo);
  }
  return taps;
}

}  // namespace

absl::StatusOr<Image> DecodeImage(absl::string_view bytes, int channels) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "images decode to 1 channel (grey) or 3 (RGB), not ", channels));
  }
  absl::StatusOr<Image> image;
  if (IsPng(bytes)) {
    image = DecodePng(bytes);
  } else if (IsJpeg(bytes)) {
    image = DecodeJpeg(bytes, channels);
  } else if (bytes.empty()) {
    return absl::DataLossError("the file is empty; write or copy it again");
  } else {
    return absl::InvalidArgumentError(
        "neither a PNG nor a JPEG (by its first bytes); convert it to one of "
        "them or move it out of the folder");
  }
  if (!image.ok()) return image.status();
  if (image->h <= 0 || image->w <= 0) {
    return absl::DataLossError("the image has no pixels");
  }
  return ToChannels(*std::move(image), channels);
}

void ResizeBilinear(const Image& in, int h, int w, uint8_t* out) {
  const int c = in.c;
  if (in.h == h && in.w == w) {
    std::memcpy(out, in.pixels.data(), in.pixels.size());
    return;
  }
  const std::vector<Tap> xs = Taps(in.w, w);
  const std::vector<Tap> ys = Taps(in.h, h);
  const int64_t in_row = int64_t{in.w} * c;
  for (int y = 0; y < h; ++y) {
    const Tap& ty = ys[y];
    const uint8_t* top = in.pixels.data() + ty.lo * in_row;
    const uint8_t* bottom = in.pixels.data() + ty.hi * in_row;
    uint8_t* dst = out + int64_t{y} * w * c;
    for (int x = 0; x < w; ++x) {
      const Tap& tx = xs[x];
      for (int k = 0; k < c; ++k) {
        const float a = top[tx.lo * c + k], b = top[tx.hi * c + k];
        const float d = bottom[tx.lo * c + k], e = bottom[tx.hi * c + k];
        const float upper = a + (b - a) * tx.t;
        const float lower = d + (e - d) * tx.t;
        const float v = upper + (lower - upper) * ty.t;
        dst[int64_t{x} * c + k] =
            static_cast<uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
      }
    }
  }
}

absl::Status DecodeImageTo(absl::string_view bytes, const Shape& shape,
                           uint8_t* out) {
  absl::StatusOr<Image> image = DecodeImage(bytes, shape.c);
  if (!image.ok()) return image.status();
  ResizeBilinear(*image, shape.h, shape.w, out);
  return absl::OkStatus();
}

}  // namespace dlbatch::trainer
