#include "trainer/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {

LossScaler::LossScaler(const Options& options) : options_(options) {
  state_.scale =
      std::clamp(options.initial_scale, options.min_scale, options.max_scale);
}

absl::StatusOr<LossScaler> LossScaler::Make(const Options& o) {
  auto bad = [](const char* field, double value, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaling: ", field, " is ", value, "; ", want));
  };
  if (!(o.min_scale > 0) || !std::isfinite(o.min_scale)) {
    return bad("min_scale", o.min_scale, "it must be positive and finite");
  }
  if (!(o.max_scale >= o.min_scale) || !std::isfinite(o.max_scale)) {
    return bad("max_scale", o.max_scale,
               "it must be finite and at least min_scale");
  }
  if (!(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale)) {
    return bad("initial_scale", o.initial_scale,
               "it must lie in [min_scale, max_scale]");
  }
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) {
    return bad("backoff_factor", o.backoff_factor, "it must be in (0, 1)");
  }
  if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor)) {
    return bad("growth_factor", o.growth_factor,
               "it must be finite and above 1");
  }
  if (o.growth_interval < 1) {
    return bad("growth_interval", static_cast<double>(o.growth_interval),
               "it must be at least 1");
  }
  return LossScaler(o);
}

bool LossScaler::Update(bool finite) {
  if (!finite) {
    state_.scale =
        std::max(state_.scale * options_.backoff_factor, options_.min_scale);
    state_.clean_steps = 0;
    ++state_.skipped_steps;
    return false;
  }
  if (++state_.clean_steps >= options_.growth_interval) {
    state_.scale =
        std::min(state_.scale * options_.growth_factor, options_.max_scale);
    state_.clean_steps = 0;
  }
  return true;
}

absl::Status LossScaler::Restore(const State& state) {
  if (!std::isfinite(state.scale) || state.scale < options_.min_scale ||
      state.scale > options_.max_scale || state.clean_steps < 0 ||
      state.skipped_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaling: a checkpoint's scale ", state.scale, " (",
                     state.clean_steps, " clean and ", state.skipped_steps,
                     " skipped steps) is outside [", options_.min_scale, ", ",
                     options_.max_scale, "]; start without --resume"));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace dlbatch::trainer
