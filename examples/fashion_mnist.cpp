// Fashion-MNIST with the reference CNN on cohort's default training loop (cohort::fit_loop),
// data-parallel over MPI ranks:
//   mpirun -np 2 ./fashion_mnist [--data DIR] [--epochs N] [--max-train N] [--storage DIR] [--name NAME] [--workers N]
//     [--device cpu|cuda] [--min-test-accuracy A]
// Each epoch reports the train loss and accuracy and the test loss and accuracy of the whole job
// (every rank scores its slice of the test set); rank 0 prints the final metrics as one JSON line,
// with the LibTorch version the program was built on ("libtorch") and the mean epoch time
// ("mean_epoch_s", the first epoch left out when there are more). With --device cuda each rank
// trains on its own GPU (scaling::cuda): the same loop, batches copied from pinned memory. The same training written by
// hand is examples/fashion_mnist_manual.cpp.

#include <cohort/cohort.hpp>
#include <cohort/torch/fit_loop.hpp>
#include <torch/version.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "fashion_mnist_net.hpp"

struct config {
  double lr = 0.05;
  double momentum = 0.9;
  int batch_size = 64;  // per rank
  int epochs = 4;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(config, lr, momentum, batch_size, epochs)

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  auto const flags = parse_fashion_flags(argc, argv);
  if (!flags) return 2;
  if (flags->validator_ranks != 0) {
    std::cerr << "--validator-ranks: this program validates inside its fit_loop on every rank; "
                 "run fashion_mnist_manual for validator ranks\n";
    return 2;
  }
  config cfg{.epochs = flags->epochs};
  cohort::run_config run{.name = flags->name, .storage_path = flags->storage};

  // Every rank reads the files (no communication), so a missing file is reported on every rank.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cohort::tensor_dataset train_set, test_set;
  try {
    train_set = first_n(load_fashion_mnist(flags->data_dir, "train"), flags->max_train);
    test_set = load_fashion_mnist(flags->data_dir, "t10k");
  } catch (cohort::error const& e) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    return 1;
  }

  // The loop: model, optimizer, loss and knobs; it shards "train" (reshuffled every epoch,
  // prefetched), validates on "test", reports each epoch with an async checkpoint, and a rerun
  // of the same --name resumes from the latest one.
  cohort::fit_loop loop{[] {
                          torch::manual_seed(0);
                          return fashion_net();
                        },
                        [](std::vector<torch::Tensor> params, config const& c) {
                          return torch::optim::SGD(params, torch::optim::SGDOptions(c.lr).momentum(c.momentum));
                        },
                        torch::nn::CrossEntropyLoss(),
                        [](config const& c) {
                          return cohort::fit_options{.batch_size = c.batch_size,
                                                     .epochs = c.epochs,
                                                     .prefetch_batches = 4,
                                                     .validation = "test",
                                                     .validation_prefix = "test"};
                        }};

  run.checkpoint_mode = cohort::checkpoint_mode::async;
  auto fit_on = [&](auto scaling) {
    cohort::trainer trainer{loop, cohort::datasets{{"train", train_set}, {"test", test_set}}, scaling,
                            cohort::sharding::shuffled{.seed = 42},
                            cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "test_accuracy", .order = cohort::max}};
    return trainer.fit(cfg, run);
  };
  auto result = flags->device == "cuda" ? fit_on(cohort::scaling::cuda{.num_workers = flags->workers})
                                        : fit_on(cohort::scaling::cpu{.num_workers = flags->workers});
  if (result.preempted) return cohort::exit_code_preempted;
  if (!result.ok()) return 1;
  if (below_accuracy_floor(result.metrics, flags->min_test_accuracy)) return 1;
  if (rank == 0) {
    auto final_metrics = result.metrics;
    final_metrics["run_path"] = result.path.string();
    final_metrics["libtorch"] = TORCH_VERSION;
    final_metrics["mean_epoch_s"] = mean_epoch_seconds(result.metrics_history);
    if (!result.best_checkpoints.empty()) final_metrics["best_checkpoint"] = result.best_checkpoints.front().path.string();
    std::cout << final_metrics.dump() << std::endl;
  }
  return 0;
}
