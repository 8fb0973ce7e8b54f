// Tuning the reference Fashion-MNIST CNN with ASHA inside one MPI job:
//   mpirun -np 2 ./tune_fashion_mnist [--data DIR] [--samples N] [--max-epochs N] [--max-train N]
//                                     [--budget-s S] [--storage DIR] [--name NAME] [--min-spread D]
//                                     [--device cpu|cuda]
// Each rank runs one trial at a time (ranks_per_trial 1), so two trials train side by side; ASHA
// stops the poor ones after 1 and 3 epochs. Searched: learning rate, momentum, batch size. Rank 0
// prints a status table every 30 s and, last, the best trial's config and metrics as one JSON line.
// Rerunning with the same --name resumes an interrupted experiment. With --device cuda every trial
// trains on a GPU of its own (scaling::cuda: trials side by side on a node get disjoint GPUs, as
// Ray's resources_per_trial={"gpu": 1}); start as many ranks per node as it has GPUs.

#include <cohort/cohort.hpp>
#include <cohort/tuning/tuner.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numbers>
#include <string>

#include "fashion_mnist_net.hpp"
#include "tune_common.hpp"

struct trial_config {
  double lr = 0.05;
  double momentum = 0.9;
  int batch_size = 64;
  int max_epochs = 5;  // the cosine learning-rate schedule runs over this many epochs
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(trial_config, lr, momentum, batch_size, max_epochs)

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string data_dir = default_fashion_mnist_dir;
  std::size_t samples = 6;
  int max_epochs = 5;
  std::int64_t max_train = 0;
  double budget_s = 780;  // running trials stop at their next report after it: the whole run stays under 15 minutes
  cohort::run_config run{.name = "", .storage_path = "cohort_results", .verbose = 1};
  double min_spread = -std::numeric_limits<double>::infinity();  // --min-spread: see finish_tuning
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data") data_dir = value;
    else if (flag == "--samples") samples = std::stoul(value);
    else if (flag == "--max-epochs") max_epochs = std::stoi(value);
    else if (flag == "--max-train") max_train = std::stoll(value);
    else if (flag == "--budget-s") budget_s = std::stod(value);
    else if (flag == "--storage") run.storage_path = value;
    else if (flag == "--name") run.name = value;
    else if (flag == "--min-spread") min_spread = std::stod(value);
    else if (flag == "--device" && (value == "cpu" || value == "cuda")) device = value;
    else {
      std::cerr << "unknown flag " << flag
                << ": use --data, --samples, --max-epochs, --max-train, --budget-s, --storage, --name, --min-spread or --device cpu|cuda\n";
      return 2;
    }
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cohort::tensor_dataset train_set, test_set;
  try {
    train_set = load_fashion_mnist(data_dir, "train");
    test_set = load_fashion_mnist(data_dir, "t10k");
  } catch (cohort::error const& e) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    return 1;
  }
  train_set = first_n(train_set, max_train);

  // One trial: a data-parallel trainer on the trial's ranks (here one), an epoch per report, a
  // checkpoint per epoch so an interrupted experiment resumes where each trial was.
  auto train = [&test_set](cohort::context& ctx, trial_config const& cfg) {
    torch::manual_seed(0);
    auto model = ctx.prepare_model(fashion_net());
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));
    auto& loader = ctx.dataset_shard("train", {.batch_size = cfg.batch_size, .prefetch_batches = 4});
    if (auto const& ck = ctx.checkpoint()) {
      cohort::loader_state position;
      cohort::load_checkpoint(*ck, model, opt, position);
      loader.restore(position);
    }
    while (loader.state().epoch < cfg.max_epochs) {
      auto const epoch = loader.state().epoch;
      double const lr = cfg.lr * 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(epoch) / cfg.max_epochs));
      for (auto& group : opt.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      auto const [loss_sum, batches] = train_epoch(model, opt, loader);
      double const accuracy = test_accuracy(ctx, model, test_set);
      ctx.report({{"epoch", epoch}, {"train_loss", loss_sum / static_cast<double>(std::max<std::int64_t>(1, batches))},
                  {"test_accuracy", accuracy}},
                 cohort::checkpoint_of(model, opt, loader.state()));
    }
  };

  auto tune_on = [&](auto scaling) {
    cohort::tuner tuner{cohort::trainer{train, cohort::datasets{{"train", train_set}}, scaling, cohort::sharding::shuffled{.seed = 42},
                                        cohort::checkpointing::keep_last{.num_to_keep = 1}},
                        cohort::search::random{.seed = 7},
                        cohort::schedule::asha{.max_t = static_cast<double>(max_epochs), .grace_period = 1, .reduction_factor = 3},
                        cohort::stop::time_budget{.time_budget_s = budget_s},
                        cohort::tune_config{.metric = "test_accuracy", .mode = cohort::max, .num_samples = samples,
                                            .ranks_per_trial = 1, .status_interval_s = 30}};
    return tuner.fit(cohort::space{{"lr", cohort::loguniform(0.01, 0.2)},
                                   {"momentum", cohort::uniform(0.8, 0.95)},
                                   {"batch_size", cohort::choice({32, 64, 128})},
                                   {"max_epochs", max_epochs}},
                     run);
  };
  auto grid = device == "cuda" ? tune_on(cohort::scaling::cuda{}) : tune_on(cohort::scaling::cpu{});
  return finish_tuning(grid, min_spread);  // 75 when preempted: rerun with the same --name to resume
}
