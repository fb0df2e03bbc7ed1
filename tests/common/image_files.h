// Writing images as PNG (libpng) and JPEG (libjpeg) files, for the tests
// and the benchmark of image folders (format: folders). Link PNG::PNG and
// JPEG::JPEG.
#ifndef DLBATCH_TESTS_COMMON_IMAGE_FILES_H_
#define DLBATCH_TESTS_COMMON_IMAGE_FILES_H_

// clang-format off: jpeglib.h needs <cstdio> first.
#include <jpeglib.h>

#include <cstdio>
// clang-format on
#include <png.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dlbatch::testing {

// Writes h x w pixels of c channels (1: grey, 3: RGB, 4: RGBA), HWC, as an
// 8-bit PNG. False where libpng fails.
inline bool WritePng(const std::string& path, int h, int w, int c,
                     const uint8_t* pixels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = c == 1   ? PNG_FORMAT_GRAY
                 : c == 3 ? PNG_FORMAT_RGB
                          : PNG_FORMAT_RGBA;
  return png_image_write_to_file(&image, path.c_str(), 0, pixels, 0, nullptr) !=
         0;
}

// The same as bytes in memory.
inline std::string EncodePng(int h, int w, int c, const uint8_t* pixels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = c == 1   ? PNG_FORMAT_GRAY
                 : c == 3 ? PNG_FORMAT_RGB
                          : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0,
                                nullptr) == 0) {
    return "";
  }
  std::string out(size, '\0');
  if (png_image_write_to_memory(&image, out.data(), &size, 0, pixels, 0,
                                nullptr) == 0) {
    return "";
  }
  out.resize(size);
  return out;
}

// Encodes h x w pixels of c channels (1 or 3) as a baseline JPEG of
// `quality` (libjpeg's default error handler ends the process on failure,
// which a test of ours never provokes).
inline std::string EncodeJpeg(int h, int w, int c, const uint8_t* pixels,
                              int quality = 90) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels) +
                   static_cast<size_t>(cinfo.next_scanline) * w * c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buffer), size);
  std::free(buffer);
  return out;
}

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_COMMON_IMAGE_FILES_H_
