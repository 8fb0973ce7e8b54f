#include <cohort/cohort.hpp>
#include <torch/version.h>

#include <cstdio>

// One rank trains y = 2x for a few steps through prepare_model and prints the LibTorch version.
int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  auto r = cohort::trainer{[](cohort::context& ctx) {
    auto model = ctx.prepare_model(torch::nn::Linear(1, 1));
    torch::optim::SGD opt(model->parameters(), 0.5);
    auto x = torch::rand({16, 1});
    double loss = 0;
    for (int step = 0; step < 500; ++step) {
      opt.zero_grad();
      auto l = torch::mse_loss(model(x), 2 * x);
      l.backward();
      opt.step();
      loss = l.item<double>();
    }
    ctx.report({{"loss", loss}});
    if (loss >= 1e-3) std::printf("consumer_torch: loss %g after 500 steps\n", loss);
    return loss < 1e-3 ? 0 : 1;
  }}.fit(nlohmann::json::object(), {.name = "consumer_torch", .storage_path = argc > 1 ? argv[1] : "runs", .verbose = 0});
  if (!r.ok() || r.return_values.front() != 0) return 1;
  std::printf("consumer_torch trained on LibTorch %s\n", TORCH_VERSION);
  return 0;
}
