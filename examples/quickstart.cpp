// The smallest data-parallel run: fit y = 2x on 200 points with 2 workers (MSE, SGD).
//   mpirun -np 2 ./quickstart [--storage DIR]
#include <cohort/cohort.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  cohort::run_config run{.name = "", .storage_path = argc > 2 && std::string(argv[1]) == "--storage" ? argv[2] : "cohort_results"};

  auto train = [](cohort::context& ctx, nlohmann::json const& cfg) {
    auto x = torch::linspace(-1, 1, 200).unsqueeze(1);
    auto y = 2 * x;
    auto model = ctx.prepare_model(torch::nn::Linear(1, 1));
    torch::optim::SGD opt(model->parameters(), cfg.value("lr", 0.1));
    for (int epoch = 0; epoch < cfg.value("epochs", 20); ++epoch) {
      auto idx = ctx.shard_indices(200, epoch);  // this rank's 100 samples, reshuffled per epoch
      auto rows = torch::tensor(std::vector<std::int64_t>(idx.begin(), idx.end()));
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

  cohort::trainer trainer{train, cohort::scaling::cpu{.num_workers = 2}, cohort::sharding::shuffled{.seed = 42}};
  auto result = trainer.fit(nlohmann::json{{"lr", 0.1}, {"epochs", 20}}, run);
  if (!result.ok()) return 1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &argc) == MPI_SUCCESS && argc == 0)
    std::cout << "weight on each rank: " << nlohmann::json(result.return_values).dump() << "\n"
              << result.metrics.dump() << std::endl;
  return 0;
}
