// Fashion-MNIST trained from WebDataset tar shards of JPEG images (made by make_fashion_shards)
// with the reference CNN on cohort::fit_loop, data-parallel over MPI ranks:
//   mpirun -np 2 ./fashion_mnist_shards --shards DIR [--data DIR] [--epochs N] [--storage DIR] [--name NAME]
//     [--workers N] [--min-test-accuracy A]
// The shards are read as a stream, never loaded whole: each rank reads its block of the epoch's
// shards, mixes samples in a shuffle buffer of 1,000, and decodes the JPEGs on 2 loader threads.
// Validation is on the in-memory test set (--data, the IDX files), as in fashion_mnist.cpp, so the
// two reach the same accuracy. Rank 0 prints the final metrics as one JSON line.

#include <cohort/cohort.hpp>
#include <cohort/torch/fit_loop.hpp>
#include <cohort/data/torch/image.hpp>
#include <cohort/data/torch/shard_dataset.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "fashion_mnist_net.hpp"

struct config {
  double lr = 0.05;
  double momentum = 0.9;
  int batch_size = 64;  // per rank
  int epochs = 4;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(config, lr, momentum, batch_size, epochs)

/// A shard sample ("<key>.jpg" 28x28 grey, "<key>.cls" the label) as the tensors fashion_net takes,
/// normalised as load_fashion_mnist does.
torch::data::Example<> fashion_sample(cohort::data::sample const& s) {
  auto image = cohort::decode_jpeg(s.member("jpg"), {.channels = 1}).to(torch::kFloat).div_(255.0).sub_(0.2860).div_(0.3530);
  return {image, torch::tensor(static_cast<std::int64_t>(std::stoi(s.text("cls"))))};
}

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string shards_dir;
  std::vector<char*> rest{argv[0]};  // the common flags, for parse_fashion_flags
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--shards" && i + 1 < argc) shards_dir = argv[++i];
    else rest.push_back(argv[i]);
  }
  auto const flags = parse_fashion_flags(static_cast<int>(rest.size()), rest.data());
  if (!flags) return 2;
  if (shards_dir.empty()) {
    std::cerr << "--shards DIR is needed: the folder of train-*.tar shards that make_fashion_shards writes\n";
    return 2;
  }

  // Every rank lists the shards and reads the test set (no communication), so bad input is
  // reported on every rank.
  cohort::shard_dataset train_set;
  cohort::tensor_dataset test_set;
  try {
    train_set = {.shards = cohort::data::shard_set::from_glob(shards_dir + "/train-*.tar"),
                 .transform = fashion_sample,
                 .sharding = {.seed = 42, .shuffle_buffer_samples = 1000}};
    test_set = load_fashion_mnist(flags->data_dir, "t10k");
  } catch (cohort::error const& e) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    return 1;
  }

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
                                                     .num_workers = 2,
                                                     .validation = "test",
                                                     .validation_prefix = "test"};
                        }};
  cohort::run_config run{.name = flags->name, .storage_path = flags->storage};
  run.checkpoint_mode = cohort::checkpoint_mode::async;
  cohort::trainer trainer{loop, cohort::datasets{{"train", train_set}, {"test", test_set}},
                          cohort::scaling::cpu{.num_workers = flags->workers},
                          cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "test_accuracy", .order = cohort::max}};
  auto result = trainer.fit(config{.epochs = flags->epochs}, run);
  if (result.preempted) return cohort::exit_code_preempted;
  if (!result.ok()) return 1;
  if (below_accuracy_floor(result.metrics, flags->min_test_accuracy)) return 1;
  if (rank == 0) {
    auto final_metrics = result.metrics;
    final_metrics["run_path"] = result.path.string();
    std::cout << final_metrics.dump() << std::endl;
  }
  return 0;
}
