// The order of each epoch and the per-channel statistics of a data set.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data/data.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {

// Counts each channel's 256 pixel values, then takes mean and standard
// deviation (population) from the histogram: exact, one pass, and fast.
// A channel without variance gets std 1, so normalising never divides by 0.
Normalization ComputeNormalization(const Dataset& data) {
  const int channels = data.shape.c;
  Normalization norm;
  if (channels <= 0) return norm;
  std::vector<std::array<int64_t, 256>> histogram(channels);
  for (auto& h : histogram) h.fill(0);
  const uint8_t* p = data.pixels.data();
  const int64_t pixels = static_cast<int64_t>(data.pixels.size()) / channels;
  if (channels == 1) {
    for (int64_t i = 0; i < pixels; ++i) ++histogram[0][p[i]];
  } else {
    for (int64_t i = 0; i < pixels; ++i) {
      for (int c = 0; c < channels; ++c) ++histogram[c][p[i * channels + c]];
    }
  }
  norm.mean.resize(channels);
  norm.std.resize(channels);
  for (int c = 0; c < channels; ++c) {
    double sum = 0;
    double sum_sq = 0;
    for (int v = 0; v < 256; ++v) {
      const double x = v / 255.0;
      sum += histogram[c][v] * x;
      sum_sq += histogram[c][v] * x * x;
    }
    const double n = pixels > 0 ? static_cast<double>(pixels) : 1.0;
    const double mean = sum / n;
    const double var = std::max(0.0, sum_sq / n - mean * mean);
    const double sd = std::sqrt(var);
    norm.mean[c] = static_cast<float>(mean);
    norm.std[c] = sd > 1e-12 ? static_cast<float>(sd) : 1.0f;
  }
  return norm;
}

// "never": 0..count-1. "every-epoch": a Fisher-Yates permutation drawn from
// Rng(Key(seed, epoch)). Anything else ("once", and the empty default, as
// MATLAB's trainingOptions defaults to "once"): epoch 0's permutation.
std::vector<int64_t> EpochOrder(const std::string& shuffle, uint64_t seed,
                                int64_t epoch, int64_t count) {
  std::vector<int64_t> order(count > 0 ? count : 0);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle == "never") return order;
  const int64_t drawn_epoch = shuffle == "every-epoch" ? epoch : 0;
  Rng rng(Key(seed, static_cast<uint64_t>(drawn_epoch)));
  for (int64_t i = count - 1; i > 0; --i) {
    const int64_t j =
        static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

// Each class's samples in data set order, shuffled by Fisher-Yates from
// Rng(Key(seed, class, kSplitStream)); the first round(fraction * n) of the
// shuffle are the second set's.
std::pair<Dataset, Dataset> SplitEachLabel(const Dataset& data, double fraction,
                                           uint64_t seed) {
  // Keeps the split's draws apart from the epoch orders' (Key(seed, epoch)).
  constexpr uint64_t kSplitStream = 0x73706c6974;  // "split"
  std::vector<std::vector<int64_t>> by_class;
  for (int64_t i = 0; i < data.count; ++i) {
    const int32_t label = data.labels[i];
    if (label >= static_cast<int32_t>(by_class.size())) {
      by_class.resize(label + 1);
    }
    by_class[label].push_back(i);
  }
  std::vector<bool> second(data.count, false);
  for (size_t label = 0; label < by_class.size(); ++label) {
    std::vector<int64_t>& members = by_class[label];
    const int64_t n = static_cast<int64_t>(members.size());
    const int64_t take =
        std::min<int64_t>(static_cast<int64_t>(std::llround(fraction * n)),
                          std::max<int64_t>(0, n - 1));
    Rng rng(Key(seed, label, kSplitStream));
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j =
          static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
      std::swap(members[i], members[j]);
    }
    for (int64_t k = 0; k < take; ++k) second[members[k]] = true;
  }
  std::pair<Dataset, Dataset> out;
  const int64_t size = data.shape.size();
  for (Dataset* part : {&out.first, &out.second}) {
    part->source = data.source;
    part->shape = data.shape;
    part->num_classes = data.num_classes;
    part->class_names = data.class_names;
  }
  for (int64_t i = 0; i < data.count; ++i) {
    Dataset& part = second[i] ? out.second : out.first;
    part.labels.push_back(data.labels[i]);
    part.pixels.insert(part.pixels.end(), data.pixels.begin() + i * size,
                       data.pixels.begin() + (i + 1) * size);
    ++part.count;
  }
  return out;
}

}  // namespace dlbatch::trainer
