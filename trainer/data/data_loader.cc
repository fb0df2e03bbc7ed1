// Preparing batches: scaling, normalisation and augmentation, and the
// loader thread that runs it ahead of training.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "trainer/data/data.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

// Stops the process on a broken contract of the caller (a programming
// error, not bad input; data files are checked with Status in LoadDataset).
void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "dlbatch trainer data: broken contract: %s\n", what);
  std::abort();
}

// out = pixel * scale[c] + bias[c]: scaling to [0, 1] and normalisation in
// one multiply-add per value.
struct PixelMap {
  // The per-channel factors repeated over kRun values, a whole number of
  // pixels where kRun % channels == 0 (1, 2, 3, 4, 6, 8, 12, 16, 24 or 48
  // channels): contiguous pixels then convert in fixed-size blocks, which
  // the compiler vectorises.
  static constexpr int kRun = 48;

  int channels = 0;
  bool periodic = false;
  std::vector<float> scale;
  std::vector<float> bias;
  float scale_run[kRun] = {};
  float bias_run[kRun] = {};
};

PixelMap MakePixelMap(const Normalization& norm, int channels) {
  PixelMap map;
  map.channels = channels;
  const std::vector<float> scale_bias = ScaleAndBias(norm, channels);
  map.scale.assign(scale_bias.begin(), scale_bias.begin() + channels);
  map.bias.assign(scale_bias.begin() + channels, scale_bias.end());
  map.periodic = channels > 0 && PixelMap::kRun % channels == 0;
  if (map.periodic) {
    for (int k = 0; k < PixelMap::kRun; ++k) {
      map.scale_run[k] = map.scale[k % channels];
      map.bias_run[k] = map.bias[k % channels];
    }
  }
  return map;
}

// Converts `pixels` contiguous pixels, from the first channel of the first.
// Built for AVX2 as well where the compiler can, picked at load time: it is
// most of the time a plain batch takes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void ConvertRun(const uint8_t* __restrict src, float* __restrict dst,
                int64_t pixels, const PixelMap& map) {
  const int64_t values = pixels * map.channels;
  if (map.channels == 1) {
    const float s = map.scale[0];
    const float b = map.bias[0];
    for (int64_t i = 0; i < values; ++i) dst[i] = src[i] * s + b;
    return;
  }
  if (map.periodic) {
    constexpr int kRun = PixelMap::kRun;
    int64_t i = 0;
    for (; i + kRun <= values; i += kRun) {
      for (int k = 0; k < kRun; ++k) {
        dst[i + k] = src[i + k] * map.scale_run[k] + map.bias_run[k];
      }
    }
    for (int k = 0; i < values; ++i, ++k) {
      dst[i] = src[i] * map.scale_run[k] + map.bias_run[k];
    }
    return;
  }
  for (int64_t i = 0; i < values; ++i) {
    const int c = static_cast<int>(i % map.channels);
    dst[i] = src[i] * map.scale[c] + map.bias[c];
  }
}

// Converts `pixels` pixels walking the source backwards (a reflected row):
// `src` is the first source pixel, the next one precedes it. Channel order
// within a pixel is kept.
void ConvertReversed(const uint8_t* __restrict src, float* __restrict dst,
                     int64_t pixels, const PixelMap& map) {
  const int channels = map.channels;
  if (channels == 1) {
    const float s = map.scale[0];
    const float b = map.bias[0];
    for (int64_t i = 0; i < pixels; ++i) dst[i] = src[-i] * s + b;
    return;
  }
  for (int64_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < channels; ++c) {
      dst[c] = src[c] * map.scale[c] + map.bias[c];
    }
    src -= channels;
    dst += channels;
  }
}

// The value of a zero (black) pixel after scaling and normalisation: what
// translations and crop padding fill with.
void Fill(float* dst, int64_t pixels, const PixelMap& map) {
  if (map.channels == 1) {
    std::fill_n(dst, pixels, map.bias[0]);
    return;
  }
  for (int64_t i = 0; i < pixels; ++i) {
    std::copy(map.bias.begin(), map.bias.end(), dst);
    dst += map.channels;
  }
}

// A uniform integer shift in [-n, n] from uniform draw `u`; 0 when n <= 0.
// Shifts past any image's size all mean "only fill": n is capped so that
// sums of shifts cannot overflow.
int Shift(int n, float u) {
  if (n <= 0) return 0;
  n = std::min(n, 1 << 20);
  return std::min(static_cast<int>(u * (2 * n + 1)), 2 * n) - n;
}

// One axis of a sample's augmentation: reflect, then translate by
// `translation` (zero fill), then pad by P and crop back (a second shift by
// `crop` in [-P, P], again filling with zeros).
AxisPlacement PlaceAxis(int size, bool reflect, int translation, int crop) {
  AxisPlacement a;
  a.reflect = reflect ? 1 : 0;
  a.shift = translation + crop;
  a.lo = std::max({0, crop, a.shift});
  a.hi = std::min({size, size + crop, size + a.shift});
  if (a.hi < a.lo) a.hi = a.lo;
  return a;
}

// Uniform draw positions of a sample's stream; fixed, so that enabling one
// kind of augmentation never changes the draws of another.
enum Draw : uint64_t {
  kDrawReflectX = 0,
  kDrawReflectY = 1,
  kDrawTranslateX = 2,
  kDrawTranslateY = 3,
  kDrawCropX = 4,
  kDrawCropY = 5,
};

SamplePlacement PlaceSample(const Shape& shape, const v1::Augmentation& aug,
                            uint64_t key) {
  const bool reflect_x =
      aug.random_x_reflection() && UniformAt(key, kDrawReflectX) < 0.5f;
  const bool reflect_y =
      aug.random_y_reflection() && UniformAt(key, kDrawReflectY) < 0.5f;
  SamplePlacement p;
  p.x = PlaceAxis(
      shape.w, reflect_x,
      Shift(aug.random_x_translation(), UniformAt(key, kDrawTranslateX)),
      Shift(aug.random_crop_padding(), UniformAt(key, kDrawCropX)));
  p.y = PlaceAxis(
      shape.h, reflect_y,
      Shift(aug.random_y_translation(), UniformAt(key, kDrawTranslateY)),
      Shift(aug.random_crop_padding(), UniformAt(key, kDrawCropY)));
  return p;
}

// Writes the sample `src` placed by `p` (SourceAt, a row at a time).
void PlaceSampleValues(const uint8_t* src, const Shape& shape,
                       const SamplePlacement& p, const PixelMap& map,
                       float* dst) {
  const int c = shape.c;
  const int64_t row = int64_t{shape.w} * c;
  for (int y = 0; y < shape.h; ++y) {
    float* out = dst + y * row;
    const int source_y = SourceAt(p.y, y, shape.h);
    if (source_y < 0) {
      Fill(out, shape.w, map);
      continue;
    }
    const uint8_t* in = src + source_y * row;
    Fill(out, p.x.lo, map);
    if (p.x.hi > p.x.lo) {
      const uint8_t* first = in + int64_t{SourceAt(p.x, p.x.lo, shape.w)} * c;
      float* to = out + int64_t{p.x.lo} * c;
      if (p.x.reflect != 0) {
        ConvertReversed(first, to, p.x.hi - p.x.lo, map);
      } else {
        ConvertRun(first, to, p.x.hi - p.x.lo, map);
      }
    }
    Fill(out + int64_t{p.x.hi} * c, shape.w - p.x.hi, map);
  }
}

// Samples sit at random places in a data set far larger than the caches:
// fetching a few samples ahead hides most of the memory latency.
constexpr int kPrefetchSamples = 4;

void Prefetch(const uint8_t* p, int64_t bytes) {
#if defined(__GNUC__)
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
#else
  (void)p;
  (void)bytes;
#endif
}

Batch Prepare(const Dataset& data, const BatchLoader::Options& options,
              const PixelMap& map, const BatchRequest& request) {
  Batch batch;
  batch.epoch = request.epoch;
  batch.iteration = request.iteration;
  batch.n = static_cast<int>(request.indices.size());
  const int64_t size = data.shape.size();
  if (options.bytes) {
    batch.pixels.resize(batch.n * size);
  } else {
    batch.images.resize(batch.n * size);
  }
  batch.labels.resize(batch.n);
  const bool augment = request.augment && AnyAugmentation(options.augmentation);
  if (augment && options.bytes) batch.placements.resize(batch.n);
  for (int64_t index : request.indices) {
    Require(index >= 0 && index < data.count,
            "a batch request's sample index is outside the data set");
  }
  for (int i = 0; i < std::min(batch.n, kPrefetchSamples); ++i) {
    Prefetch(data.pixels.data() + request.indices[i] * size, size);
  }
  for (int i = 0; i < batch.n; ++i) {
    if (i + kPrefetchSamples < batch.n) {
      Prefetch(
          data.pixels.data() + request.indices[i + kPrefetchSamples] * size,
          size);
    }
    const int64_t index = request.indices[i];
    const uint8_t* src = data.pixels.data() + index * size;
    batch.labels[i] = data.labels[index];
    SamplePlacement placement{};
    if (augment) {
      const uint64_t key =
          Key(options.seed, static_cast<uint64_t>(request.epoch),
              static_cast<uint64_t>(index));
      placement = PlaceSample(data.shape, options.augmentation, key);
    }
    if (options.bytes) {
      std::memcpy(batch.pixels.data() + i * size, src, size);
      if (augment) batch.placements[i] = placement;
      continue;
    }
    float* dst = batch.images.data() + i * size;
    if (augment) {
      PlaceSampleValues(src, data.shape, placement, map, dst);
    } else {
      ConvertRun(src, dst, data.shape.h * int64_t{data.shape.w}, map);
    }
  }
  return batch;
}

// The loader: one thread preparing requests in Push order.
class ThreadedBatchLoader final : public BatchLoader {
 public:
  ThreadedBatchLoader(const Dataset* data, Options options)
      : data_(data),
        options_(std::move(options)),
        map_(MakePixelMap(options_.normalization, data_->shape.c)),
        depth_(std::max(1, options_.depth)),
        thread_([this] { Run(); }) {}

  // Abandons pending requests and waits only for the batch in progress.
  ~ThreadedBatchLoader() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    work_cv_.SignalAll();
    ready_cv_.SignalAll();
    thread_.join();
  }

  void Push(BatchRequest request) override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || stopping_) return;  // nothing after Close is served
      pending_.push_back(std::move(request));
    }
    work_cv_.Signal();
  }

  std::optional<Batch> Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      while (!BatchOrEnd()) ready_cv_.Wait(&mu_);
      if (ready_.empty()) return std::nullopt;
      batch = std::move(ready_.front());
      ready_.pop_front();
    }
    work_cv_.Signal();
    return batch;
  }

  void Close() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    work_cv_.SignalAll();
    ready_cv_.SignalAll();
  }

 private:
  // What Next waits for: a batch ready, or none to come.
  bool BatchOrEnd() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || stopping_ ||
           (closed_ && pending_.empty() && !busy_);
  }
  // What the thread waits for: a request and room for its batch, or the end.
  bool WorkOrEnd() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ || (closed_ && pending_.empty()) ||
           (!pending_.empty() && static_cast<int>(ready_.size()) < depth_);
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      while (!WorkOrEnd()) work_cv_.Wait(&mu_);
      if (stopping_ || pending_.empty()) break;
      BatchRequest request = std::move(pending_.front());
      pending_.pop_front();
      busy_ = true;
      mu_.Unlock();
      Batch batch = Prepare(*data_, options_, map_, request);
      mu_.Lock();
      busy_ = false;
      ready_.push_back(std::move(batch));
      ready_cv_.SignalAll();
    }
    ready_cv_.SignalAll();
  }

  const Dataset* const data_;
  const Options options_;
  const PixelMap map_;
  const int depth_;

  absl::Mutex mu_;
  absl::CondVar work_cv_;   // the thread waits for work or room
  absl::CondVar ready_cv_;  // Next waits for a batch or the end
  std::deque<BatchRequest> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a batch in progress
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts once every field above is ready
};

}  // namespace

std::unique_ptr<BatchLoader> BatchLoader::Start(const Dataset* data,
                                                Options options) {
  return std::make_unique<ThreadedBatchLoader>(data, std::move(options));
}

bool AnyAugmentation(const v1::Augmentation& aug) {
  return aug.random_x_reflection() || aug.random_y_reflection() ||
         aug.random_x_translation() > 0 || aug.random_y_translation() > 0 ||
         aug.random_crop_padding() > 0;
}

std::vector<float> ScaleAndBias(const Normalization& norm, int channels) {
  Require(
      norm.mean.empty() || (static_cast<int>(norm.mean.size()) == channels &&
                            norm.std.size() == norm.mean.size()),
      "normalization needs one mean and one std per channel");
  std::vector<float> scale_bias(2 * channels, 0.0f);
  for (int c = 0; c < channels; ++c) {
    scale_bias[c] = 1.0f / 255.0f;
    if (c < static_cast<int>(norm.mean.size())) {
      scale_bias[c] = static_cast<float>(1.0 / (255.0 * norm.std[c]));
      scale_bias[channels + c] =
          static_cast<float>(-norm.mean[c] / double{norm.std[c]});
    }
  }
  return scale_bias;
}

Batch PrepareBatch(const Dataset& data, const BatchLoader::Options& options,
                   const BatchRequest& request) {
  return Prepare(data, options,
                 MakePixelMap(options.normalization, data.shape.c), request);
}

}  // namespace dlbatch::trainer
