// Backend::PrepareImages against the batch loader: the same requests made
// into images on the host (PrepareBatch, floats) and from the loader's
// bytes and placements (BatchLoader::Options::bytes) by a backend must agree
// bit for bit. data_test runs it on the CPU backend, gpu_backend_test on
// the GPU's, gpu_elements_test on the GPU kernel's arithmetic on the host.
#ifndef DLBATCH_TESTS_TRAINER_IMAGES_FROM_BYTES_H_
#define DLBATCH_TESTS_TRAINER_IMAGES_FROM_BYTES_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/data/data.h"
#include "trainer/rng.h"

namespace dlbatch::trainer::testing {

// One case: the data set's shape, normalisation or not, the augmentation.
struct ImagesFromBytesCase {
  std::string name;
  Shape shape;
  bool normalize = false;
  v1::Augmentation augmentation;
};

inline std::vector<ImagesFromBytesCase> ImagesFromBytesCases() {
  std::vector<ImagesFromBytesCase> cases;
  auto add = [&](std::string name, Shape shape, bool normalize,
                 auto configure) {
    ImagesFromBytesCase c{std::move(name), shape, normalize, {}};
    configure(c.augmentation);
    cases.push_back(std::move(c));
  };
  auto none = [](v1::Augmentation&) {};
  auto everything = [](v1::Augmentation& a) {
    a.set_random_x_reflection(true);
    a.set_random_y_reflection(true);
    a.set_random_x_translation(2);
    a.set_random_y_translation(1);
    a.set_random_crop_padding(3);
  };
  add("28x28x1 plain", {28, 28, 1}, false, none);
  add("28x28x1 normalised, everything", {28, 28, 1}, true, everything);
  add("7x6x3 normalised, everything", {7, 6, 3}, true, everything);
  add("5x9x2 reflections", {5, 9, 2}, false, [](v1::Augmentation& a) {
    a.set_random_x_reflection(true);
    a.set_random_y_reflection(true);
  });
  add("8x8x3 translations beyond the image", {8, 8, 3}, true,
      [](v1::Augmentation& a) {
        a.set_random_x_translation(12);
        a.set_random_y_translation(9);
      });
  add("6x6x1 crop padding", {6, 6, 1}, false,
      [](v1::Augmentation& a) { a.set_random_crop_padding(4); });
  return cases;
}

// Makes the images of a batch of n samples from the bytes, placements (null
// where not augmented) and per-channel factors (ScaleAndBias), all in host
// memory, into out[0, n * shape.size()); out holds out_count values, and
// those past the batch must stay as they are.
using PrepareImagesOnHost =
    std::function<void(int n, const Shape& shape, const uint8_t* pixels,
                       const SamplePlacement* placements,
                       const float* scale_bias, float* out, int64_t out_count)>;

// Runs every case through `prepare`: several batches each (epochs 0-3,
// augmented or not, the last one short). Returns "" where all agree bit for
// bit with the loader's images, else what differed first.
inline std::string CompareImagesFromBytes(const PrepareImagesOnHost& prepare) {
  for (const ImagesFromBytesCase& c : ImagesFromBytesCases()) {
    const int count = 40;
    Dataset data;
    data.source = "synthetic";
    data.shape = c.shape;
    data.count = count;
    data.num_classes = 10;
    data.pixels.resize(count * c.shape.size());
    Rng rng(Key(11));
    // 0..255: black pixels and fill both occur.
    for (uint8_t& p : data.pixels) p = static_cast<uint8_t>(rng.Below(256));
    for (int i = 0; i < count; ++i) data.labels.push_back(i % 10);

    BatchLoader::Options floats;
    floats.seed = 5;
    floats.augmentation = c.augmentation;
    if (c.normalize) floats.normalization = ComputeNormalization(data);
    BatchLoader::Options bytes = floats;
    bytes.bytes = true;
    const std::vector<float> scale_bias =
        ScaleAndBias(floats.normalization, c.shape.c);

    const int max_batch = 16;
    const int64_t sample = c.shape.size();
    for (int epoch = 0; epoch < 4; ++epoch) {
      const std::vector<int64_t> order =
          EpochOrder("every-epoch", 3, epoch, count);
      for (const bool augment : {true, false}) {
        const int n = epoch == 3 ? 5 : max_batch;
        BatchRequest r;
        r.epoch = epoch;
        r.augment = augment;
        r.indices.assign(order.begin(), order.begin() + n);
        const std::string where =
            absl::StrCat(c.name, ", epoch ", epoch,
                         augment ? ", augmented" : ", not augmented", ": ");
        const Batch want = PrepareBatch(data, floats, r);
        const Batch got = PrepareBatch(data, bytes, r);
        if (!got.images.empty() || got.labels != want.labels ||
            got.pixels.size() != static_cast<size_t>(n * sample)) {
          return where + "the bytes batch is not the samples' bytes";
        }
        for (int i = 0; i < n; ++i) {
          if (std::memcmp(got.pixels.data() + i * sample,
                          data.pixels.data() + r.indices[i] * sample,
                          sample) != 0) {
            return absl::StrCat(where, "sample ", i, "'s bytes differ");
          }
        }
        const bool placed = augment && AnyAugmentation(c.augmentation);
        if (got.placements.size() != (placed ? static_cast<size_t>(n) : 0)) {
          return absl::StrCat(where, got.placements.size(), " placements");
        }
        // The whole buffer: the values past the batch must stay as they were.
        std::vector<float> made(max_batch * sample, -7.0f);
        prepare(n, c.shape, got.pixels.data(),
                placed ? got.placements.data() : nullptr, scale_bias.data(),
                made.data(), static_cast<int64_t>(made.size()));
        for (size_t k = n * sample; k < made.size(); ++k) {
          if (made[k] != -7.0f) {
            return absl::StrCat(where, "value ", k, " past the batch of ", n,
                                " was written");
          }
        }
        for (size_t k = 0; k < static_cast<size_t>(n * sample); ++k) {
          if (std::memcmp(&made[k], &want.images[k], sizeof(float)) != 0) {
            return absl::StrCat(where, "value ", k, " (sample ", k / sample,
                                ") is ", made[k], ", the loader's ",
                                want.images[k]);
          }
        }
      }
    }
  }
  return "";
}

// The same through `backend`'s PrepareImages, on its own memory.
inline std::string CompareImagesFromBytes(Backend* backend) {
  return CompareImagesFromBytes(
      [backend](int n, const Shape& shape, const uint8_t* pixels,
                const SamplePlacement* placements, const float* scale_bias,
                float* out, int64_t out_count) {
        const int64_t bytes = n * shape.size();
        Buffer p = *backend->Allocate(bytes);
        Buffer where = *backend->Allocate(n * sizeof(SamplePlacement));
        Buffer factors = *backend->Allocate(2 * shape.c * sizeof(float));
        Buffer images = *backend->Allocate(out_count * sizeof(float));
        backend->CopyToDevice(p.as<void>(), pixels, bytes);
        if (placements != nullptr) {
          backend->CopyToDevice(where.as<void>(), placements,
                                n * sizeof(SamplePlacement));
        }
        backend->CopyToDevice(factors.f32(), scale_bias,
                              2 * shape.c * sizeof(float));
        backend->CopyToDevice(images.f32(), out, out_count * sizeof(float));
        backend->PrepareImages(
            n, shape, p.as<uint8_t>(),
            placements != nullptr ? where.as<SamplePlacement>() : nullptr,
            factors.f32(), images.f32());
        backend->CopyToHost(out, images.f32(), out_count * sizeof(float));
      });
}

}  // namespace dlbatch::trainer::testing

#endif  // DLBATCH_TESTS_TRAINER_IMAGES_FROM_BYTES_H_
