// A class trainable, the shape of Ray's `tune.Trainable`, tuned with population-based training:
//   mpirun -np 2 ./tune_trainable [--data DIR] [--population N] [--epochs N] [--max-train N]
//                                 [--storage DIR] [--name NAME] [--min-spread D]
// The class has setup(config), step(), save_checkpoint(dir), load_checkpoint(dir) and
// reset_config(config), as in Ray. Each rank runs one trial at a time; every 2 epochs PBT makes a
// trial of the bottom quarter continue from a top-quarter trial's checkpoint with its learning rate
// and momentum perturbed (x1.2 / x0.8, or resampled). Rank 0 prints the best trial as one JSON line.

#include <cohort/cohort.hpp>
#include <cohort/tuning/tuner.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "fashion_mnist_net.hpp"
#include "tune_common.hpp"

/// A two-layer perceptron on Fashion-MNIST, one epoch per step.
struct fashion_mlp_trainable {
  std::shared_ptr<cohort::tensor_dataset const> train_set{}, test_set{};  // shared by every trial on the rank
  int max_epochs = 8;

  torch::nn::Sequential model{};
  std::shared_ptr<torch::optim::SGD> optimizer{};
  int epoch = 0;
  std::int64_t batch_size = 64;

  /// Ray's setup(config): build the model and the optimizer from the trial's config.
  void setup(nlohmann::json const& config) {
    torch::manual_seed(0);
    model = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 256), torch::nn::ReLU(),
                                  torch::nn::Linear(256, 10));
    optimizer = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01));
    batch_size = config.value("batch_size", 64);
    apply(config);
  }

  /// Ray's step(): train one epoch, return its result; "done" ends the trial.
  nlohmann::json step() {
    model->train();
    auto const n = train_set->inputs.size(0);
    auto const order = torch::randperm(n, torch::TensorOptions(torch::kLong));
    double loss_sum = 0;
    std::int64_t batches = 0;
    for (std::int64_t b = 0; b < n; b += batch_size, ++batches) {
      auto idx = order.narrow(0, b, std::min(batch_size, n - b));
      optimizer->zero_grad();
      auto loss = torch::cross_entropy_loss(model->forward(train_set->inputs.index_select(0, idx)),
                                            train_set->targets.index_select(0, idx));
      loss.backward();
      optimizer->step();
      loss_sum += loss.item<double>();
    }
    ++epoch;
    auto const n_test = test_set->inputs.size(0);
    auto const accuracy = static_cast<double>(count_correct(model, *test_set, 0, n_test)) / static_cast<double>(n_test);
    return {{"epoch", epoch}, {"train_loss", loss_sum / static_cast<double>(std::max<std::int64_t>(1, batches))},
            {"test_accuracy", accuracy}, {"done", epoch >= max_epochs}};
  }

  /// Ray's save_checkpoint(dir): everything step() needs to go on, written into `dir`.
  void save_checkpoint(std::filesystem::path const& dir) const {
    torch::save(model, (dir / "model.pt").string());
    torch::save(*optimizer, (dir / "optimizer.pt").string());
    std::ofstream(dir / "state.json") << nlohmann::json{{"epoch", epoch}}.dump();
  }

  /// Ray's load_checkpoint(dir): the state back from `dir` (after setup, on every rank of the trial).
  void load_checkpoint(std::filesystem::path const& dir) {
    torch::load(model, (dir / "model.pt").string());
    // The checkpoint may be another trial's (PBT's exploit): keep this trial's hyperparameters.
    auto const options = current_options();
    torch::load(*optimizer, (dir / "optimizer.pt").string());
    set_options(options);
    epoch = nlohmann::json::parse(std::ifstream(dir / "state.json")).at("epoch").get<int>();
  }

  /// Ray's reset_config(config): take a new config in place (reuse_actors), so the next trial on
  /// this rank skips setup. The model is rebuilt; the checkpoint (if any) is loaded next.
  bool reset_config(nlohmann::json const& config) {
    setup(config);
    epoch = 0;
    return true;
  }

 private:
  void apply(nlohmann::json const& config) {
    set_options({config.at("lr").get<double>(), config.at("momentum").get<double>()});
  }
  std::pair<double, double> current_options() const {
    auto const& o = static_cast<torch::optim::SGDOptions const&>(optimizer->param_groups().front().options());
    return {o.lr(), o.momentum()};
  }
  void set_options(std::pair<double, double> lr_momentum) {
    for (auto& group : optimizer->param_groups())
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr_momentum.first).momentum(lr_momentum.second);
  }
};
static_assert(cohort::resettable_trainable<fashion_mlp_trainable>);

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string data_dir = default_fashion_mnist_dir;
  std::size_t population = 4;
  int epochs = 8;
  std::int64_t max_train = 0;
  cohort::run_config run{.name = "", .storage_path = "cohort_results", .verbose = 1};
  double min_spread = -std::numeric_limits<double>::infinity();  // --min-spread: see finish_tuning
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data") data_dir = value;
    else if (flag == "--population") population = std::stoul(value);
    else if (flag == "--epochs") epochs = std::stoi(value);
    else if (flag == "--max-train") max_train = std::stoll(value);
    else if (flag == "--storage") run.storage_path = value;
    else if (flag == "--name") run.name = value;
    else if (flag == "--min-spread") min_spread = std::stod(value);
    else {
      std::cerr << "unknown flag " << flag << ": use --data, --population, --epochs, --max-train, --storage, --name or --min-spread\n";
      return 2;
    }
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fashion_mlp_trainable prototype{.max_epochs = epochs};
  try {
    auto train_set = load_fashion_mnist(data_dir, "train");
    train_set = first_n(train_set, max_train);
    prototype.train_set = std::make_shared<cohort::tensor_dataset const>(std::move(train_set));
    prototype.test_set = std::make_shared<cohort::tensor_dataset const>(load_fashion_mnist(data_dir, "t10k"));
  } catch (cohort::error const& e) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    return 1;
  }

  using cohort::schedule::mutation;
  cohort::tuner tuner{prototype,
                      cohort::search::random{.seed = 3},
                      cohort::schedule::pbt{.perturbation_interval = 2,
                                            .hyperparam_mutations = {{"lr", mutation::range{.low = 1e-3, .high = 0.3, .log = true}},
                                                                     {"momentum", mutation::range{.low = 0.0, .high = 0.99}}},
                                            .seed = 5},
                      cohort::tune_config{.metric = "test_accuracy", .mode = cohort::max, .num_samples = population,
                                          .status_interval_s = 30, .checkpoint_frequency = 1}};
  auto grid = tuner.fit(cohort::space{{"lr", cohort::loguniform(1e-3, 0.3)},
                                      {"momentum", cohort::uniform(0.0, 0.99)},
                                      {"batch_size", 64}},
                        run);
  return finish_tuning(grid, min_spread);  // 75 when preempted: rerun with the same --name to resume
}
