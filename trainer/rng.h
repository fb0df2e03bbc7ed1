// Counter-based random numbers: every draw is a pure function of a key and
// a counter, so a draw does not depend on which rank or thread makes it, nor
// on how many draws came before (data order, augmentation, dropout and
// initialisation stay reproducible across pools and resumes).
#ifndef DLBATCH_TRAINER_RNG_H_
#define DLBATCH_TRAINER_RNG_H_

#include <cmath>
#include <cstdint>

namespace dlbatch::trainer {

// SplitMix64's finaliser: a bijective 64-bit mix. constexpr (so inline)
// for the GPU backend's kernels, which draw the same numbers on the device
// (nvcc --expt-relaxed-constexpr).
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A key derived from several parts: Key(seed, epoch, sample). constexpr
// too: the GPU's dropout kernel derives its layer's key on the device.
constexpr uint64_t Key(uint64_t a) { return Mix64(a); }
template <typename... Rest>
constexpr uint64_t Key(uint64_t a, uint64_t b, Rest... rest) {
  return Key(Mix64(a) ^ (b + 0x632be59bd9b4e019ULL), rest...);
}

// The i-th uniform draw in [0, 1) of stream `key` (24 bits, exact floats).
constexpr float UniformAt(uint64_t key, uint64_t i) {
  return static_cast<float>(Mix64(key ^ Mix64(i)) >> 40) * 0x1.0p-24f;
}

// A sequential generator over one key, for loops that draw many numbers.
class Rng {
 public:
  explicit Rng(uint64_t key) : key_(key) {}
  uint64_t NextU64() { return Mix64(key_ ^ Mix64(counter_++)); }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; the bias is
  // below 2^-32 for the sizes used here).
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(NextU64()) * n) >> 64);
  }
  // Standard normal (Box-Muller; one value per two draws, for simplicity
  // and reproducibility over speed).
  double Normal() {
    double u1 = Uniform();
    const double u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_RNG_H_
