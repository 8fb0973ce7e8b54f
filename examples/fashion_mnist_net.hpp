#pragma once
// The reference Fashion-MNIST CNN: conv 1->32 3x3 pad 1, batch norm, ReLU, max-pool 2; conv 32->64
// the same; linear 3136->128, ReLU; linear 128->10. Comparisons with PyTorch DDP use exactly this.
// And the data set: the gzipped IDX files of the Debian package dataset-fashion-mnist.

#include <cohort/cohort.hpp>
#include <cohort/data/idx.hpp>

#include <torch/torch.h>

#include <array>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

struct fashion_netImpl : torch::nn::Module {
  fashion_netImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(32))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(64))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(fashion_net);

/// A Fashion-MNIST split as tensors: images [N, 1, 28, 28] normalised, labels [N] int64.
inline cohort::tensor_dataset load_fashion_mnist(std::string const& dir, std::string const& split) {
  auto images = cohort::data::read_idx(std::filesystem::path(dir) / (split + "-images-idx3-ubyte.gz"));
  auto labels = cohort::data::read_idx(std::filesystem::path(dir) / (split + "-labels-idx1-ubyte.gz"));
  if (images.dims.size() != 3 || labels.dims.size() != 1 || images.dims[0] != labels.dims[0])
    throw cohort::error("Fashion-MNIST files in " + dir + " do not match (" + split +
                        "): expected N x 28 x 28 images and N labels");
  auto n = images.dims[0];
  // (v / 255 - mean) / std for each of the 256 byte values, then one pass over the pixels: the
  // four tensor passes it replaces (to float, divide, subtract, divide) took about 0.1 s of the
  // launch for the 47 M training pixels.
  std::array<float, 256> normalised{};
  for (int v = 0; v < 256; ++v) normalised[v] = (static_cast<float>(v) / 255.0f - 0.2860f) / 0.3530f;
  auto x = torch::empty({n, 1, images.dims[1], images.dims[2]}, torch::kFloat);
  float* out = x.data_ptr<float>();
  for (std::size_t i = 0; i < images.data.size(); ++i) out[i] = normalised[images.data[i]];
  auto y = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kLong);
  return {x, y};
}

/// The first `n` samples of `set` (all of them when n is 0 or at least the size).
inline cohort::tensor_dataset first_n(cohort::tensor_dataset const& set, std::int64_t n) {
  if (n <= 0 || n >= set.inputs.size(0)) return set;
  return {set.inputs.narrow(0, 0, n), set.targets.narrow(0, 0, n)};
}

/// How many of samples [lo, hi) of `set` the model classifies correctly (eval mode, no grad),
/// in batches of 128: with 1000 the first convolution's output (100 MB) left the caches and the
/// whole test set took 1.55x as long on one core (docs/benchmarks.md, "Fashion-MNIST example").
template <class Net>
std::int64_t count_correct(Net& net, cohort::tensor_dataset const& set, std::int64_t lo, std::int64_t hi) {
  constexpr std::int64_t eval_batch = 128;
  net->eval();
  torch::NoGradGuard no_grad;
  auto const device = net->parameters().front().device();  // the test set stays on the CPU; each batch goes there
  std::int64_t correct = 0;
  for (auto b = lo; b < hi; b += eval_batch) {
    auto len = std::min<std::int64_t>(eval_batch, hi - b);
    auto const x = set.inputs.narrow(0, b, len).to(device), y = set.targets.narrow(0, b, len).to(device);
    correct += net->forward(x).argmax(1).eq(y).sum().template item<std::int64_t>();
  }
  return correct;
}

/// One epoch of SGD with cross-entropy over this rank's batches: the summed loss and the number of batches.
template <class Net, class Loader>
std::pair<double, std::int64_t> train_epoch(Net& net, torch::optim::Optimizer& opt, Loader& loader) {
  net->train();
  double loss_sum = 0;
  std::int64_t batches = 0;
  for (auto& b : loader.epoch()) {
    opt.zero_grad();
    auto loss = torch::cross_entropy_loss(net(b.inputs), b.targets);
    loss.backward();
    opt.step();
    loss_sum += loss.template item<double>();
    ++batches;
  }
  return {loss_sum, batches};
}

/// Accuracy on `test` of the trainer's ranks together: each rank scores its own slice, the counts
/// are summed over the trainer's communicator (one all-reduce).
template <class Net>
double test_accuracy(cohort::context& ctx, Net& net, cohort::tensor_dataset const& test) {
  auto const n = test.inputs.size(0);
  auto const per = (n + ctx.world_size() - 1) / ctx.world_size();
  auto const lo = std::min<std::int64_t>(n, per * ctx.world_rank());
  std::int64_t correct = count_correct(net, test, lo, std::min<std::int64_t>(n, lo + per));
  ctx.comm().allreduce(&correct, 1, cohort::comm::reduce_op::sum);
  return static_cast<double>(correct) / static_cast<double>(n);
}

/// The examples' --min-test-accuracy: true, after one line on every rank's stderr, when the run's
/// final test accuracy (the same on every rank) is below `floor`.
inline bool below_accuracy_floor(nlohmann::json const& metrics, double floor) {
  double const got = metrics.value("test_accuracy", 0.0);
  if (got >= floor) return false;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: test accuracy " + std::to_string(got) +
                " is below --min-test-accuracy " + std::to_string(floor) + ": train longer (--epochs, --max-train)\n");
  return true;
}

/// The mean of the reports' time_this_iter_s, the first left out when there are more (it holds
/// the warm-up: allocator, cuDNN's choice of algorithms); 0 without reports.
inline double mean_epoch_seconds(std::vector<nlohmann::json> const& history) {
  double sum = 0;
  int n = 0;
  for (std::size_t i = history.size() > 1 ? 1 : 0; i < history.size(); ++i, ++n) sum += history[i].value("time_this_iter_s", 0.0);
  return n > 0 ? sum / n : 0.0;
}

/// Where the Fashion-MNIST files are unless --data says: $FASHION_MNIST_DIR where set (a copy
/// elsewhere), else where the Debian package dataset-fashion-mnist puts them.
inline std::string const default_fashion_mnist_dir = [] {
  char const* d = std::getenv("FASHION_MNIST_DIR");
  return std::string(d && *d ? d : "/usr/share/datasets/fashion-mnist");
}();

/// The command line of the two Fashion-MNIST programs (fashion_mnist.cpp on fit_loop,
/// fashion_mnist_manual.cpp by hand):
///   [--data DIR] [--epochs N] [--max-train N] [--storage DIR] [--name NAME] [--workers N]
///   [--device cpu|cuda] [--min-test-accuracy A] [--validator-ranks N] (fashion_mnist_manual only)
struct fashion_flags {
  std::string data_dir = default_fashion_mnist_dir;
  int epochs = 4;
  std::int64_t max_train = 0;         ///< 0: all 60,000 training images
  std::string storage = "cohort_results";
  std::string name{};                 ///< the run's name; a rerun of the same name resumes it
  int workers = 2;                    ///< the rank count mpirun must start
  std::string device = "cpu";         ///< cpu (scaling::cpu) or cuda (scaling::cuda: one GPU per rank)
  double min_test_accuracy = 0;       ///< exit 1 when the final test accuracy is below it
  int validator_ranks = 0;            ///< fashion_mnist_manual: the last N ranks validate checkpoints instead of training
};

/// Reads the flags above; nothing (after one line on stderr naming the flags) for an unknown
/// flag, a flag without its value, or a value that is not a number where one is needed.
inline std::optional<fashion_flags> parse_fashion_flags(int argc, char** argv) {
  fashion_flags f;
  for (int i = 1; i < argc; i += 2) {
    std::string const flag = argv[i];
    try {
      if (i + 1 >= argc) throw std::invalid_argument("no value");
      std::string const value = argv[i + 1];
      if (flag == "--data") f.data_dir = value;
      else if (flag == "--epochs") f.epochs = std::stoi(value);
      else if (flag == "--max-train") f.max_train = std::stoll(value);
      else if (flag == "--storage") f.storage = value;
      else if (flag == "--name") f.name = value;
      else if (flag == "--workers") f.workers = std::stoi(value);
      else if (flag == "--device" && (value == "cpu" || value == "cuda")) f.device = value;
      else if (flag == "--min-test-accuracy") f.min_test_accuracy = std::stod(value);
      else if (flag == "--validator-ranks") f.validator_ranks = std::stoi(value);
      else throw std::invalid_argument("unknown");
    } catch (std::exception const&) {
      std::cerr << "bad flag " << flag << " (or its value): use --data DIR, --epochs N, --max-train N, --storage DIR, "
                                          "--name NAME, --workers N, --device cpu|cuda, --min-test-accuracy A or --validator-ranks N\n";
      return std::nullopt;
    }
  }
  return f;
}
