#pragma once
/// \file
/// cohort::device to torch::Device.

#include <torch/types.h>

#include "cohort/scaling/device.hpp"

namespace cohort {

/// The LibTorch device of a cohort::device.
inline ::torch::Device to_torch(device d) {
  return d.kind == device_kind::cpu ? ::torch::Device(::torch::kCPU)
                                    : ::torch::Device(::torch::kCUDA, static_cast<c10::DeviceIndex>(d.index));
}

}  // namespace cohort
