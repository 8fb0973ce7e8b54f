// Fashion-MNIST with the reference CNN, data-parallel over MPI ranks, the training loop written by
// hand (examples/fashion_mnist.cpp is the same on cohort::fit_loop):
//   mpirun -np 2 ./fashion_mnist_manual [--data DIR] [--epochs N] [--max-train N] [--storage DIR] [--name NAME] [--workers N]
//     [--min-test-accuracy A] [--validator-ranks N]
// With --validator-ranks N, start N more ranks (mpirun -np 3 ... --validator-ranks 1): they score each
// checkpoint on the test set while the --workers ranks train.
// Reports train loss, test accuracy and the share of time spent waiting for data each epoch; rank 0 prints the final metrics
// as one JSON line, with the LibTorch version the program was built on ("libtorch").

#include <cohort/cohort.hpp>
#include <cohort/data/idx.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "fashion_mnist_net.hpp"

struct config {
  double lr = 0.05;
  double momentum = 0.9;
  int batch_size = 64;  // per rank
  int epochs = 4;
  std::int64_t max_train = 0;  // 0: all 60000 training images
  std::string data_dir = default_fashion_mnist_dir;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(config, lr, momentum, batch_size, epochs, max_train, data_dir)


int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  auto const flags = parse_fashion_flags(argc, argv);
  if (!flags) return 2;
  config cfg{.epochs = flags->epochs, .max_train = flags->max_train, .data_dir = flags->data_dir};
  cohort::run_config run{.name = flags->name, .storage_path = flags->storage};

  // Every rank reads the files (no communication), so a missing file is reported on every rank.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cohort::tensor_dataset train_set, test_set;
  try {
    train_set = load_fashion_mnist(cfg.data_dir, "train");
    test_set = load_fashion_mnist(cfg.data_dir, "t10k");
  } catch (cohort::error const& e) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    return 1;
  }
  train_set = first_n(train_set, cfg.max_train);

  // Each committed checkpoint is scored on the whole test set while training goes on, and
  // keep_best ranks checkpoints by it: by a background thread of rank 0 (Ray's validate_fn), or
  // with --validator-ranks on ranks of their own, each scoring a slice (one all-reduce among them).
  std::int64_t const test_size = test_set.inputs.size(0);
  auto correct_in = [&test_set](cohort::checkpoint const& ck, std::int64_t lo, std::int64_t hi) {
    fashion_net net;
    cohort::load_checkpoint(ck, net);
    return count_correct(net, test_set, lo, hi);
  };
  auto accuracy_of = [test_size](std::int64_t correct) {
    return nlohmann::json{{"val_test_accuracy", static_cast<double>(correct) / static_cast<double>(test_size)}};
  };
  cohort::validate_fn validate;
  if (flags->validator_ranks == 0) {
    validate = [=](cohort::checkpoint const& ck) { return accuracy_of(correct_in(ck, 0, test_size)); };
  } else {
    run.validators = {.ranks = flags->validator_ranks, .validate = [=](cohort::checkpoint const& ck, cohort::validator_context& v) {
                        auto const per = (test_size + v.world_size() - 1) / v.world_size();
                        auto const lo = std::min<std::int64_t>(test_size, per * v.world_rank());
                        std::int64_t correct = correct_in(ck, lo, std::min<std::int64_t>(test_size, lo + per));
                        v.comm().allreduce(&correct, 1, cohort::comm::reduce_op::sum);
                        return accuracy_of(correct);
                      }};
  }

  auto train = [&test_set, &validate](cohort::context& ctx, config const& cfg) {
    torch::manual_seed(0);
    double last_stall_s = 0;
    auto model = ctx.prepare_model(fashion_net());
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));
    // This rank's shard, reshuffled every epoch, batches made ahead by a background thread.
    auto& loader = ctx.dataset_shard("train", {.batch_size = cfg.batch_size, .prefetch_batches = 4});
    if (auto const& ck = ctx.checkpoint()) {  // a rerun of the same --name resumes here
      cohort::loader_state position;
      cohort::load_checkpoint(*ck, model, opt, position);
      loader.restore(position);
    }

    while (loader.state().epoch < cfg.epochs) {
      auto const epoch = loader.state().epoch;
      auto const epoch_start = std::chrono::steady_clock::now();
      auto const wait_before = loader.stats().wait_s;
      auto const batches_before = loader.stats().batches;
      auto [loss_sum, batches] = train_epoch(model, opt, loader);
      double const epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      double const wait_share = (loader.stats().wait_s - wait_before) / epoch_s;
      double const step_s = epoch_s / static_cast<double>(std::max<std::int64_t>(1, loader.stats().batches - batches_before));
      double const accuracy = test_accuracy(ctx, model, test_set);
      double losses[2] = {loss_sum, static_cast<double>(batches)};
      ctx.comm().allreduce(losses, 2, cohort::comm::reduce_op::sum);
      double worst_wait = wait_share;
      ctx.comm().allreduce(&worst_wait, 1, cohort::comm::reduce_op::max);
      // An async checkpoint: report() copies the state and returns; a background thread writes
      // it while the next epoch trains. last_stall is how long that copy held training up.
      auto const report_start = std::chrono::steady_clock::now();
      ctx.report({{"epoch", epoch},
                  {"train_loss", losses[0] / losses[1]},
                  {"data_wait_share", worst_wait},
                  {"last_checkpoint_stall_share_of_step", last_stall_s / step_s},
                  {"test_accuracy", accuracy}},
                 cohort::checkpoint_of(model, opt, loader.state()), validate);
      last_stall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - report_start).count();
    }
  };

  run.checkpoint_mode = cohort::checkpoint_mode::async;
  cohort::trainer trainer{train, cohort::datasets{{"train", train_set}}, cohort::scaling::cpu{.num_workers = flags->workers},
                          cohort::sharding::shuffled{.seed = 42},
                          cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "val_test_accuracy", .order = cohort::max}};
  auto result = trainer.fit(cfg, run);
  if (result.preempted) return cohort::exit_code_preempted;
  if (!result.ok()) return 1;
  if (below_accuracy_floor(result.metrics, flags->min_test_accuracy)) return 1;
  if (result.best_checkpoints.empty() || !result.best_checkpoints.front().metrics.contains("val_test_accuracy")) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: the best checkpoint has no val_test_accuracy: " +
                  (result.best_checkpoints.empty() ? std::string("no checkpoint") : result.best_checkpoints.front().metrics.dump()) + "\n");
    return 1;
  }
  if (rank == 0) {
    auto final_metrics = result.metrics;
    final_metrics["run_path"] = result.path.string();
    final_metrics["libtorch"] = TORCH_VERSION;
    if (!result.best_checkpoints.empty()) {
      final_metrics["best_checkpoint"] = result.best_checkpoints.front().path.string();
      final_metrics["best_val_test_accuracy"] = result.best_checkpoints.front().metrics.value("val_test_accuracy", -1.0);
    }
    std::cout << final_metrics.dump() << std::endl;
  }
  return 0;
}
