#include "trainer/solver.h"

namespace dlbatch::trainer {

absl::StatusOr<std::unique_ptr<Solver>> Solver::Create(const Options& options,
                                                       Backend* backend,
                                                       Network* network) {
  std::unique_ptr<Solver> solver(new Solver(options, backend, network));
  const int64_t p = network->num_params();
  solver->state_size_ = options.solver == SolverKind::kAdam ? 2 * p : p;
  auto buffer = backend->Allocate(
      static_cast<size_t>(std::max<int64_t>(1, solver->state_size_)) *
      sizeof(float));
  if (!buffer.ok()) {
    const char* what = options.solver == SolverKind::kAdam
                           ? "the solver's state (adam's two moments)"
                       : options.solver == SolverKind::kRmsprop
                           ? "the solver's state (rmsprop's mean squares)"
                           : "the solver's state (sgdm's velocities)";
    return ParameterMemoryError(*backend, solver->state_size_, what);
  }
  solver->state_ = std::move(buffer).value();
  return solver;
}

void Solver::Step(double lr, int64_t step) {
  Network& net = *network_;
  const int64_t p = net.num_params();
  if (options_.gradient_threshold > 0) {
    // On the device: no wait for the host inside a step.
    for (const ParamInfo& info : net.params_info()) {
      backend_->ClipToNorm(info.count, options_.gradient_threshold,
                           net.grads() + info.offset);
    }
  }
  const float l2 = static_cast<float>(options_.l2_regularization);
  float* state = state_.f32();
  switch (options_.solver) {
    case SolverKind::kSgdm:
      if (options_.nesterov) {
        backend_->SgdmNesterovUpdate(p, net.num_decayed(),
                                     static_cast<float>(lr),
                                     static_cast<float>(options_.momentum), l2,
                                     net.params(), net.grads(), state);
      } else {
        backend_->SgdmUpdate(p, net.num_decayed(), static_cast<float>(lr),
                             static_cast<float>(options_.momentum), l2,
                             net.params(), net.grads(), state);
      }
      break;
    case SolverKind::kAdam:
      backend_->AdamUpdate(p, net.num_decayed(), static_cast<float>(lr),
                           static_cast<float>(options_.beta1),
                           static_cast<float>(options_.beta2),
                           static_cast<float>(options_.epsilon), step, l2,
                           net.params(), net.grads(), state, state + p);
      break;
    case SolverKind::kRmsprop:
      backend_->RmspropUpdate(p, net.num_decayed(), static_cast<float>(lr),
                              static_cast<float>(options_.beta2),
                              static_cast<float>(options_.epsilon), l2,
                              net.params(), net.grads(), state);
      break;
  }
}

std::vector<float> Solver::SaveState() const {
  std::vector<float> host(state_size_);
  if (state_size_ > 0) {
    backend_->CopyToHost(host.data(), state_.f32(),
                         host.size() * sizeof(float));
  }
  return host;
}

void Solver::LoadState(const std::vector<float>& state) {
  if (state_size_ > 0) {
    backend_->CopyToDevice(state_.f32(), state.data(),
                           state.size() * sizeof(float));
  }
}

}  // namespace dlbatch::trainer
