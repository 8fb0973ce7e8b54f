#pragma once
// The reference Fashion-MNIST CNN: conv 1->32 3x3 pad 1, batch norm, ReLU, max-pool 2; conv 32->64
// the same; linear 3136->128, ReLU; linear 128->10. Comparisons with PyTorch DDP use exactly this.

#include <torch/torch.h>

struct fashion_netImpl : torch::nn::Module {
  fashion_netImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(32))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(64))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(fashion_net);
