#pragma once
/// \file
/// Mixed precision: cohort::autocast, a scope in which LibTorch's autocast runs eligible
/// operations (matrix products, convolutions, linear layers) in bfloat16 or float16 while the
/// parameters, their gradients and the optimizer stay in float32 (Python's `torch.autocast`).

#include <ATen/autocast_mode.h>
#include <torch/types.h>
#include <torch/version.h>

#include <string>

#include "cohort/error.hpp"
#include "cohort/scaling/device.hpp"

namespace cohort {

namespace detail {

// LibTorch 2.4 replaced the per-device autocast functions (set_cpu_enabled, ...) with ones taking
// the device type, and deprecated the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(at::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(at::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
inline at::ScalarType autocast_dtype(at::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
inline void set_autocast_dtype(at::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
inline bool autocast_enabled(at::DeviceType d) {
  return d == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(at::DeviceType d, bool on) {
  if (d == at::kCPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocast_dtype(at::DeviceType d) {
  return d == at::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(at::DeviceType d, at::ScalarType t) {
  if (d == at::kCPU) at::autocast::set_autocast_cpu_dtype(t);
  else at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace detail

/// While it lives, LibTorch's autocast is on for `dev`'s device type on this thread: eligible
/// operations of the forward pass run in `dtype` (bfloat16 by default), the others in float32;
/// the backward pass follows the forward's types, so parameters and gradients stay float32 and
/// prepare_model's reducer averages them as usual. Nests; restores the previous state on exit.
/// Use it around the forward pass and the loss, not around backward or the optimizer step:
/// `{ cohort::autocast mixed{ctx.device()}; loss = loss_fn(model(x), y); } loss.backward();`
/// float16 needs loss scaling to keep small gradients from flushing to zero: cohort::grad_scaler
/// (torch/grad_scaler.hpp; LibTorch's C++ API has no GradScaler). float16 is accepted on CUDA only.
class autocast {
 public:
  explicit autocast(device dev, at::ScalarType dtype = at::kBFloat16)
      : type_(dev.kind == device_kind::cpu ? at::kCPU : at::kCUDA) {
    if (dtype != at::kBFloat16 && dtype != at::kHalf)
      throw cohort::error(std::string("cohort::autocast: dtype ") + c10::toString(dtype) +
                          " is not a reduced precision: use torch::kBFloat16 (or torch::kHalf on CUDA)");
    if (dtype == at::kHalf && type_ == at::kCPU)
      throw cohort::error("cohort::autocast: float16 autocast on the CPU is not supported: use torch::kBFloat16");
    was_enabled_ = detail::autocast_enabled(type_);
    was_dtype_ = detail::autocast_dtype(type_);
    detail::set_autocast_dtype(type_, dtype);
    detail::set_autocast_enabled(type_, true);
    at::autocast::increment_nesting();
  }
  autocast(autocast const&) = delete;
  autocast& operator=(autocast const&) = delete;
  ~autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // the cast weights of this scope
    detail::set_autocast_enabled(type_, was_enabled_);
    detail::set_autocast_dtype(type_, was_dtype_);
  }

 private:
  at::DeviceType type_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace cohort
