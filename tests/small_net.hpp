#pragma once
// The small model of the checkpoint and fault-tolerance tests: 3 -> 6 (tanh) -> 1.
#include <torch/torch.h>

namespace cohort_test {

struct small_netImpl : torch::nn::Module {
  small_netImpl()
      : l1(register_module("l1", torch::nn::Linear(3, 6))), l2(register_module("l2", torch::nn::Linear(6, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return l2(torch::tanh(l1(x))); }
  torch::nn::Linear l1, l2;
};
TORCH_MODULE(small_net);

}  // namespace cohort_test
