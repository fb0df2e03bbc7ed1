#include "trainer/options.h"

#include <algorithm>
#include <cmath>

namespace dlbatch::trainer {

Options ResolveOptions(const v1::TrainingOptions& spec) {
  Options o;
  if (spec.solver() == "adam") o.solver = SolverKind::kAdam;
  if (spec.solver() == "rmsprop") o.solver = SolverKind::kRmsprop;
  if (o.solver != SolverKind::kSgdm) o.initial_learn_rate = 0.001;
  if (o.solver == SolverKind::kRmsprop) o.beta2 = 0.9;
  if (spec.has_initial_learn_rate())
    o.initial_learn_rate = spec.initial_learn_rate();
  if (spec.has_momentum()) o.momentum = spec.momentum();
  if (spec.has_l2_regularization())
    o.l2_regularization = spec.l2_regularization();
  if (spec.has_gradient_threshold())
    o.gradient_threshold = spec.gradient_threshold();
  if (spec.has_gradient_decay_factor()) o.beta1 = spec.gradient_decay_factor();
  if (spec.has_squared_gradient_decay_factor()) {
    o.beta2 = spec.squared_gradient_decay_factor();
  }
  if (spec.has_epsilon()) o.epsilon = spec.epsilon();
  o.nesterov = spec.nesterov();
  if (spec.has_label_smoothing()) o.label_smoothing = spec.label_smoothing();
  o.schedule = spec.learn_rate_schedule();
  if (o.schedule.type().empty()) o.schedule.set_type("none");
  if (o.schedule.type() == "piecewise") {
    if (o.schedule.drop_factor() == 0) o.schedule.set_drop_factor(0.1);
    if (o.schedule.drop_period() == 0) o.schedule.set_drop_period(10);
  }
  if (o.schedule.type() == "step") {
    if (o.schedule.gamma() == 0) o.schedule.set_gamma(0.1);
    if (o.schedule.step_size() == 0) o.schedule.set_step_size(1000);
  }
  if (spec.has_mini_batch_size()) o.mini_batch_size = spec.mini_batch_size();
  if (spec.has_max_epochs()) o.max_epochs = spec.max_epochs();
  if (spec.has_max_iterations()) o.max_iterations = spec.max_iterations();
  if (!spec.shuffle().empty()) o.shuffle = spec.shuffle();
  if (spec.has_validation_frequency()) {
    o.validation_frequency = spec.validation_frequency();
  }
  if (spec.has_validation_patience()) {
    o.validation_patience = spec.validation_patience();
  }
  if (spec.has_verbose_frequency())
    o.verbose_frequency = spec.verbose_frequency();
  if (spec.has_checkpoint_frequency()) {
    o.checkpoint_frequency = spec.checkpoint_frequency();
  }
  o.checkpoint_per_iteration = spec.checkpoint_frequency_unit() == "iteration";
  if (spec.has_seed()) o.seed = spec.seed();
  if (!spec.execution_environment().empty()) {
    o.execution_environment = spec.execution_environment();
  }
  return o;
}

double LearnRate(const Options& options, int64_t iteration, int64_t epoch,
                 int64_t total_iterations) {
  const v1::LearnRateSchedule& s = options.schedule;
  const double lr0 = options.initial_learn_rate;
  const int64_t warmup = s.warmup_iterations();
  double lr = lr0;
  if (s.type() == "piecewise") {
    const double drops = std::floor((epoch - 1) / s.drop_period());
    lr = lr0 * std::pow(s.drop_factor(), std::max(0.0, drops));
  } else if (s.type() == "inv") {
    lr = lr0 *
         std::pow(1.0 + s.gamma() * static_cast<double>(iteration), -s.power());
  } else if (s.type() == "step") {
    lr = lr0 *
         std::pow(s.gamma(), static_cast<double>(iteration / s.step_size()));
  } else if (s.type() == "cosine") {
    const double span = std::max<int64_t>(1, total_iterations - warmup);
    const double t =
        std::clamp(static_cast<double>(iteration - warmup) / span, 0.0, 1.0);
    lr = lr0 * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  if (iteration < warmup) {
    lr *= static_cast<double>(iteration + 1) / static_cast<double>(warmup);
  }
  return lr;
}

}  // namespace dlbatch::trainer
