// The solver: one fused pass over the network's contiguous parameter
// buffer per step, with its state (sgdm's velocity, adam's moments,
// rmsprop's mean square) in one contiguous device buffer beside it.
#ifndef DLBATCH_TRAINER_SOLVER_H_
#define DLBATCH_TRAINER_SOLVER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/network.h"
#include "trainer/options.h"

namespace dlbatch::trainer {

class Solver {
 public:
  // `backend` and `network` must outlive the solver.
  static absl::StatusOr<std::unique_ptr<Solver>> Create(const Options& options,
                                                        Backend* backend,
                                                        Network* network);

  // Applies the network's gradients (already averaged over the global
  // batch) with learning rate `lr`. `step` counts updates from 1 (adam's
  // bias correction). With a gradient threshold, each learnable array whose
  // gradient's L2 norm exceeds it is scaled down to it first (MATLAB's
  // l2norm method); L2 regularisation is added inside the update, to
  // weights only.
  void Step(double lr, int64_t step);

  // The state, for checkpoints: floats, state_size() of them.
  int64_t state_size() const { return state_size_; }
  std::vector<float> SaveState() const;
  // REQUIRES: state.size() == state_size().
  void LoadState(const std::vector<float>& state);

 private:
  Solver(const Options& options, Backend* backend, Network* network)
      : options_(options), backend_(backend), network_(network) {}

  Options options_;
  Backend* backend_;
  Network* network_;
  int64_t state_size_ = 0;
  Buffer state_;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_SOLVER_H_
