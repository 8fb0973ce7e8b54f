// The NCCL gradient path of prepare_model on the GPU: buckets as the .grad of each parameter,
// all-reduced on a side stream behind backward, the optimizer step ordered after them with no host
// synchronisation. Each rank on its own GPU (tests/gpu/gpu_main.cpp makes it the current device),
// every rank on the same data: the average of equal gradients is the gradient itself, so the
// results must equal a model without the path, bit for bit, at 1 rank and at 2. Then a loss
// scaled by rank + 1, whose average over N ranks is the gradient times (N + 1) / 2: at 2 ranks a
// path that does not all-reduce keeps each rank's own (the multi-rank arithmetic of the same
// reducer on other data is tested on CPU over MPI, tests/torch/test_prepare_model.cpp). Then what a one-GPU user runs: prepare_model on
// scaling::cuda, float16 autocast with grad_scaler, and fit_loop (pinned batches copied to the GPU)
// against the same loop on the CPU.

// The CPU gradient path (MPI communicator, buckets, reducer) includes no GPU header, even in a
// program built with the NCCL backend: checked before anything else is included.
#include <cohort/comm/mpi.hpp>
#include <cohort/torch/device_buckets.hpp>
#include <cohort/torch/flat_buckets.hpp>
#include <cohort/torch/gradient_reducer.hpp>
#if !COHORT_WITH_NCCL
#error "tests/gpu is built with the NCCL backend (cohort::nccl defines COHORT_WITH_NCCL)"
#endif
#if defined(__CUDA_RUNTIME_H__) || defined(NCCL_H_)
#error "the CPU gradient path includes a GPU header: keep CUDA and NCCL behind cohort/torch/nccl_buckets.hpp"
#endif

#include <cohort/cohort.hpp>
#include <cohort/torch/fit_loop.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "../catch.hpp"

namespace {
/// The job's rank count: `fit` gathers one return value from each.
std::size_t ranks() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return static_cast<std::size_t>(n);
}
}  // namespace

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

/// One backward of a fresh CUDA batch through `net` and `plain`, their gradients cleared first;
/// `net`'s loss multiplied by `net_loss_factor`.
void backward_fresh_batch(mlp& net, mlp& plain, double net_loss_factor) {
  auto x = torch::randn({32, 64}, torch::kCUDA);
  auto y = torch::randint(0, 10, {32}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  for (auto* m : {&net, &plain})
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  (torch::nn::functional::cross_entropy(net.forward(x), y) * net_loss_factor).backward();
  torch::nn::functional::cross_entropy(plain.forward(x), y).backward();
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
    // Different gradients on each rank. Catches (at 2 ranks) an all-reduce that is a no-op or
    // sums without averaging: rank r would hold (r + 1) g, or 3 g, instead of 1.5 g.
    backward_fresh_batch(net, plain, c.rank() + 1);
    double const mean_factor = (c.size() + 1) / 2.0;
    for (std::size_t i = 0; i < net.parameters().size(); ++i)
      CHECK(torch::allclose(net.parameters()[i].grad(), plain.parameters()[i].grad() * mean_factor, 1e-5, 1e-7));
  }
  // bfloat16 compression: the gradients, rounded to bfloat16 on the way (one rank: the average
  // of one), so after one step each parameter moved by -lr * bf16(grad) exactly.
  options.compression = cohort::gradient_compression::bfloat16;
  cohort::detail::gradient_reducer reducer(c, net.parameters(), options, cohort::reduce_on::training_thread,
                                           cohort::detail::make_device_buckets(c, current_device(), 60'000));
  backward_fresh_batch(net, plain, 1.0);
  for (std::size_t i = 0; i < net.parameters().size(); ++i) {
    auto const ref = plain.parameters()[i].grad();
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
  REQUIRE(r.return_values.size() == ranks());  // a loop over none checks nothing
  for (std::size_t k = 0; k < r.return_values.size(); ++k) {  // one host: rank k on device k
    CHECK(r.return_values[k]["on_gpu"] == true);
    CHECK(r.return_values[k]["device"] == "cuda:" + std::to_string(k));
  }
}

TEST_CASE("float16 autocast with grad_scaler on the GPU: overflowing steps skipped, the scale backed off, training goes on", "[gpu][torch]") {
  // Catches: a grad_scaler that misses an overflow of CUDA gradients (the parameters turn inf or
  // NaN), one that never backs off (every step skipped) or never steps, autocast that does not run
  // the forward in float16 on CUDA, and parameters or gradients that leave float32 or the GPU.
  // A scale of 2^40 overflows the float16 backward of the first layers (the loss's gradient times
  // 2^40 is far above float16's 65504), so the first steps are skipped until the scale is small
  // enough; the scale never goes below 2^40 / 2^skipped.
  auto r = cohort::trainer{[](cohort::context& ctx) {
             torch::manual_seed(13);
             auto model = ctx.prepare_model(std::make_shared<mlp>());
             auto const dev = cohort::to_torch(ctx.device());
             torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
             cohort::grad_scaler scaler({.init_scale = 1099511627776.0, .growth_interval = 10});
             auto gen = torch::make_generator<at::CPUGeneratorImpl>(7);
             auto x = torch::randn({128, 64}, gen).to(dev);
             auto y = torch::randint(0, 10, {128}, gen).to(dev);
             std::vector<double> losses;
             bool forward_half = true, float32_on_gpu = true;
             int steps_taken = 0;
             for (int step = 0; step < 60; ++step) {
               opt.zero_grad();
               torch::Tensor loss;
               {
                 cohort::autocast mixed{ctx.device(), torch::kHalf};
                 auto logits = model->forward(x);
                 forward_half = forward_half && logits.scalar_type() == torch::kHalf;
                 loss = torch::nn::functional::cross_entropy(logits, y);  // float32 under autocast
               }
               losses.push_back(loss.item<double>());
               scaler.scale(loss).backward();
               steps_taken += scaler.step(opt) ? 1 : 0;
               scaler.update();
             }
             bool finite = true;
             for (auto const& p : model->parameters()) {
               finite = finite && torch::isfinite(p).all().item<bool>();
               float32_on_gpu = float32_on_gpu && p.is_cuda() && p.scalar_type() == torch::kFloat && p.grad().is_cuda() &&
                                p.grad().scalar_type() == torch::kFloat;
             }
             return nlohmann::json{{"skipped", scaler.skipped_steps()}, {"taken", steps_taken}, {"scale", scaler.current_scale()},
                                   {"first_loss", losses.front()}, {"last_loss", losses.back()}, {"finite", finite},
                                   {"half", forward_half}, {"float32_on_gpu", float32_on_gpu}};
           },
           cohort::scaling::cuda{}}
               .fit(nlohmann::json::object(), {.name = "gpu_grad_scaler", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0});
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == ranks());  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    INFO(v.dump());
    CHECK(v["half"] == true);
    CHECK(v["float32_on_gpu"] == true);
    CHECK(v["finite"] == true);
    CHECK(v["skipped"].get<std::int64_t>() >= 1);   // 2^40 overflows float16
    CHECK(v["skipped"].get<std::int64_t>() <= 40);  // and backs off to a scale that does not
    CHECK(v["skipped"].get<std::int64_t>() + v["taken"].get<int>() == 60);
    CHECK(v["scale"].get<double>() < 1099511627776.0);
    CHECK(v["last_loss"].get<double>() < 0.9 * v["first_loss"].get<double>());  // it learned
  }
}

namespace {

struct loop_config {
  double lr = 0.1;
  std::int64_t epochs = 3;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(loop_config, lr, epochs)

/// 8 features labelled by a fixed linear teacher, on the CPU (the loader pins and copies them).
cohort::tensor_dataset teacher_data(std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(0);
  auto const teacher = torch::randn({8, 3});
  torch::manual_seed(seed);
  auto x = torch::randn({n, 8});
  return {x, x.matmul(teacher).argmax(1)};
}

/// 8 -> 16 (ReLU) -> 3, the same initial weights on every call.
torch::nn::Sequential make_small_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
}
torch::optim::SGD make_small_sgd(std::vector<torch::Tensor> params, loop_config const& c) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(c.lr).momentum(0.9));
}

/// The weights of `run`'s latest checkpoint, loaded into a CPU model, flattened.
template <class Run, class MakeNet>
torch::Tensor checkpoint_weights(Run const& run, MakeNet make_net) {
  REQUIRE(run.checkpoint);
  auto net = make_net();
  cohort::load_checkpoint(cohort::checkpoint::from_directory(run.checkpoint->path), net);
  std::vector<torch::Tensor> flat;
  for (auto const& p : net->parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

}  // namespace

TEST_CASE("fit_loop on scaling::cuda trains on the GPU to the weights it reaches on the CPU", "[gpu][torch]") {
  // Catches: batches left on the CPU (a device mismatch in forward), a non-blocking copy not
  // ordered before the step or a pinned buffer reused too early (other weights), validation and
  // metric sums that break on CUDA tensors, and a checkpoint of CUDA tensors that a CPU model
  // cannot load.
  auto const make_net = make_small_net;
  auto const make_sgd = make_small_sgd;
  cohort::fit_options const options{.batch_size = 4, .epochs = 3, .prefetch_batches = 2, .validation = "val"};
  cohort::datasets const data{{"train", teacher_data(96, 1)}, {"val", teacher_data(30, 2)}};
  std::filesystem::remove_all("/tmp/cohort-gpu-tests/fit_loop_cuda");
  std::filesystem::remove_all("/tmp/cohort-gpu-tests/fit_loop_cpu");
  auto on_gpu = cohort::trainer{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(), options}, data,
                                cohort::sharding::shuffled{.seed = 7}, cohort::scaling::cuda{}}
                    .fit(loop_config{}, {.name = "fit_loop_cuda", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0});
  auto on_cpu = cohort::trainer{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(), options}, data,
                                cohort::sharding::shuffled{.seed = 7}}
                    .fit(loop_config{}, {.name = "fit_loop_cpu", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0});
  REQUIRE(on_gpu.ok());
  REQUIRE(on_cpu.ok());
  REQUIRE(on_gpu.metrics_history.size() == 3);
  CHECK(on_gpu.metrics_history.back().at("train_loss").get<double>() < on_gpu.metrics_history.front().at("train_loss").get<double>());
  CHECK_THAT(on_gpu.metrics.at("val_accuracy").get<double>(), Catch::Matchers::WithinAbs(on_cpu.metrics.at("val_accuracy").get<double>(), 1e-9));
  CHECK_THAT(on_gpu.metrics.at("val_loss").get<double>(), Catch::Matchers::WithinRel(on_cpu.metrics.at("val_loss").get<double>(), 1e-4));
  auto const gpu_weights = checkpoint_weights(on_gpu, make_net), cpu_weights = checkpoint_weights(on_cpu, make_net);
  INFO("largest difference " << (gpu_weights - cpu_weights).abs().max().item<double>());
  CHECK(torch::allclose(gpu_weights, cpu_weights, 1e-4, 1e-5));  // float32 on both, sums in another order
}

TEST_CASE("fit_loop on scaling::cuda in float16 scales the loss, skips the steps that overflow, and resumes with its scale", "[gpu][torch]") {
  // Catches: the default loop's float16 path not scaling (small gradients flushed, or no skip
  // where 2^24 times the loss's gradient overflows float16), a step taken on inf gradients (the
  // weights turn inf or NaN), clipping of the scaled gradients, a resumed run that forgets its
  // scale (it would start again from 2^24 and skip again).
  auto options = [](loop_config const& c) {
    return cohort::fit_options{.batch_size = 4, .epochs = c.epochs, .validation = "val",
                               .precision = cohort::mixed_precision::float16,
                               .loss_scaling = cohort::grad_scaler_options{.init_scale = 0x1p24, .growth_interval = 1000},
                               .max_grad_norm = 5.0};
  };
  cohort::datasets const data{{"train", teacher_data(96, 1)}, {"val", teacher_data(30, 2)}};
  std::filesystem::remove_all("/tmp/cohort-gpu-tests/fit_loop_half");
  auto fit = [&](std::int64_t epochs) {
    return cohort::trainer{cohort::fit_loop{make_small_net, make_small_sgd, torch::nn::CrossEntropyLoss(), options}, data,
                           cohort::sharding::shuffled{.seed = 7}, cohort::scaling::cuda{}}
        .fit(loop_config{.epochs = epochs}, {.name = "fit_loop_half", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0});
  };
  auto first = fit(2);
  REQUIRE(first.ok());
  REQUIRE(first.metrics_history.size() == 2);
  auto const& e0 = first.metrics_history.front();
  INFO(e0.dump());
  CHECK(e0.at("train_skipped_steps").get<std::int64_t>() >= 1);
  CHECK(e0.at("train_skipped_steps").get<std::int64_t>() <= 20);
  CHECK(first.metrics.at("loss_scale").get<double>() < 0x1p24);
  auto rest = fit(4);  // the same run name: resumes after epoch 1
  REQUIRE(rest.ok());
  REQUIRE(rest.metrics_history.size() == 4);
  INFO(rest.metrics_history.at(2).dump());
  CHECK(rest.metrics_history.at(2).at("train_skipped_steps") == 0);
  CHECK(rest.metrics_history.at(2).at("loss_scale").get<double>() <= first.metrics.at("loss_scale").get<double>());
  CHECK(rest.metrics.at("train_loss").get<double>() < e0.at("train_loss").get<double>());
  CHECK(std::isfinite(rest.metrics.at("val_loss").get<double>()));
  CHECK(torch::isfinite(checkpoint_weights(rest, make_small_net)).all().item<bool>());
}

TEST_CASE("a gradient all-reduce that cannot start ends the run with the collective's error within its deadline", "[gpu][torch]") {
  // What a one-GPU job can show of the never-hang rule: the NCCL gradient path forced on over a
  // one-rank communicator, LibTorch's current stream held (as if a peer never came), a 500 ms
  // collective deadline. Catches a watchdog that never fires or a training thread that never
  // hears of it: the run would end only when the stream is opened (after 3 s), without an error.
  std::atomic<bool> open{false};
  auto const t0 = std::chrono::steady_clock::now();
  auto r = cohort::trainer{[&](cohort::context& ctx) {
             torch::manual_seed(3);
             auto net = std::make_shared<mlp>();
             net->to(torch::kCUDA);
             cohort::detail::gradient_reducer reducer(
                 ctx.comm(), net->parameters(), cohort::model_options{}, cohort::reduce_on::training_thread,
                 cohort::detail::make_device_buckets(ctx.comm(), current_device(), ctx.collective_timeout_ms()));
             torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01));
             auto x = torch::randn({32, 64}, torch::kCUDA);
             auto y = torch::randint(0, 10, {32}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
             auto step = [&] {
               opt.zero_grad();
               torch::nn::functional::cross_entropy(net->forward(x), y).backward();
               opt.step();
             };
             step();
             torch::cuda::synchronize();  // one good step first
             auto const stream = cohort::detail::current_cuda_stream(current_device());
             REQUIRE(cudaLaunchHostFunc(stream, [](void* o) { while (!static_cast<std::atomic<bool>*>(o)->load()) {} }, &open) ==
                     cudaSuccess);
             // Opened after 3 s whatever happens, so that a path that never gives up ends (and fails below).
             std::jthread opener([&open] {
               std::this_thread::sleep_for(std::chrono::seconds(3));
               open = true;
             });
             for (auto const end = std::chrono::steady_clock::now() + std::chrono::seconds(5); std::chrono::steady_clock::now() < end;) {
               step();
               std::this_thread::sleep_for(std::chrono::milliseconds(20));
             }
           },
           cohort::scaling::cuda{}}
               .fit(nlohmann::json::object(), {.name = "gpu_held_stream", .storage_path = "/tmp/cohort-gpu-tests", .verbose = 0,
                                               .collective_timeout_ms = 500});
  auto const took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("gradient all-reduce"));
  CHECK_THAT(*r.error, contains_text("did not complete within 500 ms"));
  CHECK(took < std::chrono::milliseconds(500) + std::chrono::seconds(10));
}
