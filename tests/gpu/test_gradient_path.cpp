// The NCCL gradient path of prepare_model on the GPU: buckets as the .grad of each parameter,
// all-reduced on a side stream behind backward, the optimizer step ordered after them with no host
// synchronisation. Each rank on its own GPU (tests/gpu/gpu_main.cpp makes it the current device),
// every rank on the same data: the average of equal gradients is the gradient itself, so the
// results must equal a model without the path, bit for bit, at 1 rank and at 2; the multi-rank
// arithmetic of the same reducer on different data is tested on CPU over MPI
// (tests/torch/test_prepare_model.cpp).
#include <cohort/cohort.hpp>

#include <cuda_runtime.h>

#include "../catch.hpp"

namespace {

struct mlp : torch::nn::Module {
  mlp() {
    l1 = register_module("l1", torch::nn::Linear(64, 256));
    l2 = register_module("l2", torch::nn::Linear(256, 256));
    l3 = register_module("l3", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};

/// Trains `net` for `steps` SGD steps on fixed CUDA data (no host synchronisation in between).
void train(mlp& net, int steps) {
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(7);
  auto x = torch::randn({128, 64}, gen).to(torch::kCUDA);
  auto y = torch::randint(0, 10, {128}, gen).to(torch::kCUDA);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net.forward(x), y).backward();
    opt.step();
  }
}

/// This rank's CUDA device (gpu_main.cpp set it).
int current_device() {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

}  // namespace

TEST_CASE("the NCCL gradient path averages bucketed gradients on the GPU and orders the step after them", "[gpu][torch]") {
  auto world = cohort::comm::mpi::world();
  auto c = cohort::comm::any::ref(world);
  torch::manual_seed(11);
  mlp plain;
  plain.to(torch::kCUDA);
  mlp net;
  net.to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < net.parameters().size(); ++i) net.parameters()[i].copy_(plain.parameters()[i]);
  }
  cohort::model_options options{.bucket_cap_bytes = 64 << 10, .first_bucket_cap_bytes = 4 << 10};
  {
    cohort::detail::gradient_reducer reducer(c, net.parameters(), options, cohort::reduce_on::training_thread,
                                             cohort::detail::make_device_buckets(c, current_device(), 60'000));
    REQUIRE(reducer.num_buckets() >= 3);  // several buckets, some launched mid-backward, some grouped
    train(net, 5);
    train(plain, 5);
    for (std::size_t i = 0; i < net.parameters().size(); ++i) {
      CHECK(torch::equal(net.parameters()[i], plain.parameters()[i]));
      CHECK(net.parameters()[i].grad().is_cuda());
    }
  }
  // bfloat16 compression: the gradients, rounded to bfloat16 on the way (one rank: the average
  // of one), so after one step each parameter moved by -lr * bf16(grad) exactly.
  options.compression = cohort::gradient_compression::bfloat16;
  cohort::detail::gradient_reducer reducer(c, net.parameters(), options, cohort::reduce_on::training_thread,
                                           cohort::detail::make_device_buckets(c, current_device(), 60'000));
  auto x = torch::randn({32, 64}, torch::kCUDA);
  auto y = torch::randint(0, 10, {32}, torch::kCUDA);
  for (auto& p : net.parameters()) p.mutable_grad() = torch::Tensor();
  for (auto& p : plain.parameters()) p.mutable_grad() = torch::Tensor();
  torch::nn::functional::cross_entropy(net.forward(x), y).backward();
  torch::nn::functional::cross_entropy(plain.forward(x), y).backward();
  for (std::size_t i = 0; i < net.parameters().size(); ++i) {
    auto const& ref = plain.parameters()[i].grad();
    CHECK(torch::equal(net.parameters()[i].grad(), ref.to(torch::kBFloat16).to(torch::kFloat)));
  }
}

TEST_CASE("prepare_model on scaling::cuda trains on the rank's GPU", "[gpu][torch]") {
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             auto model = ctx.prepare_model(std::make_shared<mlp>());
                             train(*model, 3);
                             return nlohmann::json{{"device", ctx.device().str()},
                                                   {"on_gpu", model->parameters()[0].is_cuda()}};
                           },
                           cohort::scaling::cuda{}}
               .fit(nlohmann::json::object(), {.name = "gpu_prepare", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0});
  REQUIRE(r.ok());
  for (std::size_t k = 0; k < r.return_values.size(); ++k) {  // one host: rank k on device k
    CHECK(r.return_values[k]["on_gpu"] == true);
    CHECK(r.return_values[k]["device"] == "cuda:" + std::to_string(k));
  }
}
