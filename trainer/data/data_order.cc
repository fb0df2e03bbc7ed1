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

}  // namespace dlbatch::trainer
