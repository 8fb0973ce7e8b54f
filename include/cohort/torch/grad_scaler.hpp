#pragma once
/// \file
/// cohort::grad_scaler: dynamic loss scaling for float16 training (Python's torch.amp.GradScaler,
/// which LibTorch's C++ API lacks in every version): the loss is multiplied by a large scale
/// before backward so that small float16 gradients do not flush to zero, the gradients are
/// divided by it before the optimizer step, and a step whose gradients overflowed is skipped and
/// the scale lowered.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"

namespace cohort {

/// The knobs of grad_scaler, with GradScaler's defaults.
struct grad_scaler_options {
  double init_scale = 65536.0;          ///< the first scale (2^16)
  double growth_factor = 2.0;           ///< the scale is multiplied by this after growth_interval steps in a row without inf/NaN
  double backoff_factor = 0.5;          ///< and by this after a step with inf/NaN gradients (that step skipped)
  std::int64_t growth_interval = 2000;  ///< good steps in a row before the scale grows
  bool enabled = true;                  ///< false: scale() returns the loss, step() always steps
};

/// Dynamic loss scaling, used as Python's GradScaler is:
///
///     cohort::grad_scaler scaler;
///     { cohort::autocast mixed{ctx.device(), torch::kHalf}; loss = loss_fn(model(x), y); }
///     scaler.scale(loss).backward();
///     scaler.unscale(opt);            // optional: before clipping gradients
///     scaler.step(opt);               // skipped when a gradient is inf or NaN
///     scaler.update();                // the scale backs off after a skipped step, grows after good ones
///
/// Under prepare_model the gradients are averaged during backward, so every rank sees the same
/// gradients, finds the same overflow and skips the same steps: no collective of its own.
/// Its state (scale and good-step count) goes into checkpoints through state()/load_state().
class grad_scaler {
 public:
  /// Throws cohort::error for knobs GradScaler refuses (a scale that is not positive, a growth
  /// factor not above 1, a backoff factor not in (0, 1), a growth interval below 1).
  explicit grad_scaler(grad_scaler_options options = {}) : o_(options), scale_(options.init_scale) {
    if (!(o_.init_scale > 0)) throw cohort::error("grad_scaler: .init_scale must be positive (GradScaler's default: 65536)");
    if (!(o_.growth_factor > 1)) throw cohort::error("grad_scaler: .growth_factor must be above 1 (default 2)");
    if (!(o_.backoff_factor > 0 && o_.backoff_factor < 1))
      throw cohort::error("grad_scaler: .backoff_factor must be between 0 and 1 (default 0.5)");
    if (o_.growth_interval < 1) throw cohort::error("grad_scaler: .growth_interval must be at least 1 (default 2000)");
  }

  /// The loss times the current scale: call backward() on it.
  torch::Tensor scale(torch::Tensor const& loss) const { return o_.enabled ? loss * scale_ : loss; }

  /// Divides the gradients of `opt`'s parameters by the scale and notes whether any is inf or
  /// NaN. Once per optimizer and step (step() calls it when you did not); call it before
  /// clipping or reading gradients. Throws cohort::error when called twice before update().
  void unscale(torch::optim::Optimizer& opt) {
    if (!o_.enabled) return;
    if (unscaled(opt)) throw cohort::error("grad_scaler::unscale: called twice for one optimizer before update()");
    torch::NoGradGuard no_grad;
    torch::Tensor finite;
    double const inv = 1.0 / scale_;
    for (auto& group : opt.param_groups())
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& g = p.mutable_grad();
        g.mul_(inv);
        auto ok = torch::isfinite(g).all();
        finite = finite.defined() ? finite.logical_and(ok) : ok;
      }
    bool const overflow = finite.defined() && !finite.item<bool>();  // one host synchronisation per step
    unscaled_.push_back({&opt, overflow});
    found_inf_ = found_inf_ || overflow;
  }

  /// opt.step() unless a gradient of `opt` was inf or NaN; returns whether it stepped.
  bool step(torch::optim::Optimizer& opt) {
    if (!o_.enabled) {
      opt.step();
      return true;
    }
    if (!unscaled(opt)) unscale(opt);
    if (unscaled(opt)->overflow) {
      ++skipped_;
      return false;
    }
    opt.step();
    return true;
  }

  /// Ends the step: after a step with inf/NaN gradients the scale is multiplied by
  /// backoff_factor; after growth_interval good steps in a row, by growth_factor.
  void update() {
    if (!o_.enabled) return;
    if (found_inf_) {
      scale_ *= o_.backoff_factor;
      good_steps_ = 0;
    } else if (++good_steps_ >= o_.growth_interval) {
      scale_ *= o_.growth_factor;
      good_steps_ = 0;
    }
    found_inf_ = false;
    unscaled_.clear();
  }

  /// The current scale (GradScaler's get_scale()).
  double current_scale() const { return scale_; }
  /// Steps skipped so far because a gradient was inf or NaN.
  std::int64_t skipped_steps() const { return skipped_; }

  /// {"scale", "growth_tracker"}: what a checkpoint keeps (GradScaler's state_dict).
  nlohmann::json state() const { return {{"scale", scale_}, {"growth_tracker", good_steps_}}; }
  /// Restores what state() returned; throws cohort::error for anything else.
  void load_state(nlohmann::json const& s) {
    if (!s.is_object() || !s.contains("scale") || !s["scale"].is_number() || !(s["scale"].get<double>() > 0) ||
        !s.contains("growth_tracker") || !s["growth_tracker"].is_number_integer())
      throw cohort::error("grad_scaler::load_state: expected {\"scale\": <positive number>, \"growth_tracker\": <integer>}, got " +
                          s.dump());
    scale_ = s["scale"].get<double>();
    good_steps_ = s["growth_tracker"].get<std::int64_t>();
  }

 private:
  struct unscaled_optimizer {
    torch::optim::Optimizer const* opt;
    bool overflow;
  };
  /// `opt`'s entry of this step, if unscale() ran for it.
  unscaled_optimizer const* unscaled(torch::optim::Optimizer const& opt) const {
    auto it = std::find_if(unscaled_.begin(), unscaled_.end(), [&](auto const& u) { return u.opt == &opt; });
    return it == unscaled_.end() ? nullptr : &*it;
  }

  grad_scaler_options o_;
  double scale_;
  std::int64_t good_steps_ = 0;
  std::int64_t skipped_ = 0;
  bool found_inf_ = false;
  std::vector<unscaled_optimizer> unscaled_;  ///< this step's, until update()
};

}  // namespace cohort
