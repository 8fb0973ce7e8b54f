// The smallest data-parallel run: fit y = 2x on 200 points with 2 workers (MSE, SGD).
//   mpirun -np 2 ./quickstart [--storage DIR] [--device cpu|cuda] [--workers N] [--mlflow URI]
// With --device cuda each rank trains on its own GPU (mpirun -np 1 ... --workers 1 on one GPU).
// With --mlflow the run is logged to that MLflow tracking server (experiment "quickstart"), where
// the build linked cohort::mlflow (libcurl).
#include <cohort/cohort.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  cohort::run_config run{.name = "", .storage_path = "cohort_results"};
  std::string device = "cpu", mlflow_uri;
  int workers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const flag = argv[i], value = argv[i + 1];
    if (flag == "--storage") run.storage_path = value;
    else if (flag == "--device" && (value == "cpu" || value == "cuda")) device = value;
    else if (flag == "--workers") workers = std::stoi(value);
    else if (flag == "--mlflow") mlflow_uri = value;
    else {
      std::cerr << "unknown flag " << flag << " (or its value): use --storage DIR, --device cpu|cuda, --workers N or --mlflow URI\n";
      return 2;
    }
  }
#if !COHORT_WITH_MLFLOW
  if (!mlflow_uri.empty()) {
    std::cerr << "--mlflow: this build has no MLflow client; build the example linked with cohort::mlflow (libcurl)\n";
    return 2;
  }
#endif

  auto train = [](cohort::context& ctx, nlohmann::json const& cfg) {
    auto const dev = cohort::to_torch(ctx.device());  // this rank's CPU or GPU
    auto x = torch::linspace(-1, 1, 200).unsqueeze(1).to(dev);
    auto y = 2 * x;
    auto model = ctx.prepare_model(torch::nn::Linear(1, 1));
    torch::optim::SGD opt(model->parameters(), cfg.value("lr", 0.1));
    for (int epoch = 0; epoch < cfg.value("epochs", 20); ++epoch) {
      auto idx = ctx.shard_indices(200, epoch);  // this rank's 100 samples, reshuffled per epoch
      auto rows = torch::tensor(std::vector<std::int64_t>(idx.begin(), idx.end())).to(dev);
      double loss_sum = 0;
      for (std::int64_t b = 0; b < rows.size(0); b += 10) {
        auto batch = rows.narrow(0, b, 10);
        opt.zero_grad();
        auto loss = torch::mse_loss(model(x.index_select(0, batch)), y.index_select(0, batch));
        loss.backward();
        opt.step();
        loss_sum += loss.item<double>();
      }
      ctx.report({{"epoch", epoch}, {"loss", loss_sum / 10}});
    }
    return model->weight.item<double>();  // every rank's, gathered in the result
  };

  auto fit_with = [&](auto scaling, auto... callbacks) {
    cohort::trainer trainer{train, scaling, cohort::sharding::shuffled{.seed = 42}, callbacks...};
    return trainer.fit(nlohmann::json{{"lr", 0.1}, {"epochs", 20}}, run);
  };
  auto fit_on = [&](auto scaling) {
#if COHORT_WITH_MLFLOW
    if (!mlflow_uri.empty())
      return fit_with(scaling, cohort::report::mlflow{.tracking_uri = mlflow_uri, .experiment_name = "quickstart"});
#endif
    return fit_with(scaling);
  };
  auto result = device == "cuda" ? fit_on(cohort::scaling::cuda{.num_workers = workers})
                                 : fit_on(cohort::scaling::cpu{.num_workers = workers});
  if (!result.ok()) return 1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &argc) == MPI_SUCCESS && argc == 0)
    std::cout << "weight on each rank: " << nlohmann::json(result.return_values).dump() << "\n"
              << result.metrics.dump() << std::endl;
  return 0;
}
