#pragma once
/// \file
/// cohort::device: where a rank computes, without depending on LibTorch.

#include <string>

namespace cohort {

/// Kind of compute device.
enum class device_kind { cpu, cuda };

/// A rank's compute device. `str()` is LibTorch's device string ("cpu", "cuda:1"), so
/// `torch::Device(ctx.device().str())` works; torch/to_torch.hpp adds `cohort::to_torch`.
struct device {
  device_kind kind = device_kind::cpu;
  int index = -1;  ///< device ordinal, -1 for the CPU

  std::string str() const { return kind == device_kind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
  friend bool operator==(device const&, device const&) = default;
};

}  // namespace cohort
