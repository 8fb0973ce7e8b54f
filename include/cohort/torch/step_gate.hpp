#pragma once
/// \file
/// How an async checkpoint and the gradient reducer tell whether an optimizer step happened (a
/// few sampled values of each tensor) and hold the next step until a checkpoint has copied the
/// tensors it refers to.

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <latch>
#include <vector>

namespace cohort::detail {

/// Fills `out` with a few sampled values of each tensor (first, middle, last element, as bits):
/// cheap to take, and changed by an optimizer step with any non-zero update. `out` is left empty
/// when a tensor is not a contiguous CPU float or double tensor (nothing can be told then). It
/// reuses `out`'s memory: no allocation once it has held as many values.
inline void sample_values(std::vector<torch::Tensor> const& tensors, std::vector<std::uint64_t>& out) {
  out.clear();
  for (auto const& t : tensors) {
    bool const readable = t.defined() && t.device().is_cpu() && t.is_contiguous() && t.numel() > 0 &&
                          (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
    if (!readable) {
      out.clear();
      return;
    }
    auto const n = t.numel();
    for (auto i : {std::int64_t{0}, n / 2, n - 1}) {
      std::uint64_t bits = 0;
      if (t.scalar_type() == torch::kFloat) {
        std::uint32_t b32 = 0;
        std::memcpy(&b32, t.data_ptr<float>() + i, sizeof b32);
        bits = b32;
      } else {
        std::memcpy(&bits, t.data_ptr<double>() + i, sizeof bits);
      }
      out.push_back(bits);
    }
  }
}

/// sample_values into a new vector.
inline std::vector<std::uint64_t> sampled_values(std::vector<torch::Tensor> const& tensors) {
  std::vector<std::uint64_t> out;
  sample_values(tensors, out);
  return out;
}

/// Holds a prepared model's next optimizer step until an async checkpoint has copied the live
/// tensors it refers to (CheckFreq's pipelined snapshot): opened once by the checkpoint writer,
/// or when the checkpoint is dropped; the end of every backward waits for the gates it holds.
class step_gate {
 public:
  /// Opens the gate (once; later calls do nothing).
  void open() {
    if (!opened_.exchange(true)) latch_.count_down();
  }
  /// Blocks until open() was called.
  void wait() { latch_.wait(); }

 private:
  std::latch latch_{1};
  std::atomic<bool> opened_{false};
};

}  // namespace cohort::detail
