// The path a user runs first, timed: one epoch of cohort::fit_loop through the trainer, as
// examples/fashion_mnist.cpp runs it (the loader's shuffled shard with batches made ahead,
// validation on a test set, an async checkpoint kept by keep_best, the result files), against the
// same epoch written by hand in the same process (MPI and LibTorch: this rank's slice of a shuffled
// order, index_select batches, forward, backward, MPI_Allreduce of each gradient, SGD step; the
// same metrics, the same validation, the model and optimizer saved by rank 0). The reference CNN,
// batch 64 per rank, on random images of Fashion-MNIST's shape.
//   mpirun -np 2 ./bench_fit_loop [--smoke | --guard] [--rounds N] [--train N] [--test N]
// Prints one JSON line (rank 0): each side's median epoch seconds and the median of the rounds'
// ratios. --guard: 9 alternating rounds on 4,096 training and 1,024 test images; the median ratio
// must stay <= 1.09 (docs/benchmarks.md, "The example's path against a hand-written epoch": 1.00-1.02
// alone at -O1, up to 1.06 beside a build at nice 19; a sleep of a tenth of each step in fit_loop
// gives 1.11-1.15).
#include <cohort/cohort.hpp>
#include <cohort/torch/fit_loop.hpp>
#include <torch/version.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fashion_mnist_net.hpp"
#include "mpi_bench.hpp"

namespace {

constexpr std::int64_t batch_size = 64;  // per rank, as the example
constexpr double lr = 0.05, momentum = 0.9;

struct sizes {
  int rounds = 5;
  std::int64_t train = 8192;
  std::int64_t test = 2048;
};

/// `n` random images of Fashion-MNIST's shape and random labels (the step's cost does not depend
/// on the pixels).
cohort::tensor_dataset random_images(std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({n, 1, 28, 28}), torch::randint(0, 10, {n}, torch::kLong)};
}

/// One epoch through cohort, as examples/fashion_mnist.cpp trains (a fresh run directory each).
double cohort_epoch(cohort::tensor_dataset const& train, cohort::tensor_dataset const& test, std::string const& storage,
                    int round) {
  cohort::fit_loop loop{[] {
                          torch::manual_seed(0);
                          return fashion_net();
                        },
                        [](std::vector<torch::Tensor> params, nlohmann::json const&) {
                          return torch::optim::SGD(params, torch::optim::SGDOptions(lr).momentum(momentum));
                        },
                        torch::nn::CrossEntropyLoss(),
                        cohort::fit_options{.batch_size = batch_size,
                                            .epochs = 1,
                                            .prefetch_batches = 4,
                                            .validation = "test",
                                            .validation_prefix = "test"}};
  cohort::trainer trainer{loop, cohort::datasets{{"train", train}, {"test", test}}, cohort::scaling::cpu{},
                          cohort::sharding::shuffled{.seed = 42},
                          cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "test_accuracy", .order = cohort::max}};
  cohort::run_config run{.name = "fit_loop_" + std::to_string(round), .storage_path = storage, .verbose = 0};
  run.checkpoint_mode = cohort::checkpoint_mode::async;
  bool ok = true;
  double const s = cohort_bench::slowest_seconds([&] { ok = trainer.fit(nlohmann::json::object(), run).ok(); });
  if (!ok) {
    std::fprintf(stderr, "error: the fit_loop epoch failed\n");
    cohort_bench::failed = true;
  }
  return s;
}

/// Sums of the loss, the correct answers and the samples, over the job (one MPI_Allreduce).
struct sums {
  double loss = 0, correct = 0, samples = 0;
  void over_job() { MPI_Allreduce(MPI_IN_PLACE, &loss, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); }
};

void add(sums& s, torch::Tensor const& output, torch::Tensor const& loss, torch::Tensor const& y) {
  auto const n = static_cast<double>(y.size(0));
  s.loss += loss.item<double>() * n;
  s.correct += static_cast<double>(output.argmax(1).eq(y).sum().item<std::int64_t>());
  s.samples += n;
}

/// The same epoch written by hand: what the fit_loop epoch does, without cohort.
double handwritten_epoch(cohort::tensor_dataset const& train, cohort::tensor_dataset const& test,
                         std::filesystem::path const& storage) {
  return cohort_bench::slowest_seconds([&] {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    torch::manual_seed(0);
    auto net = fashion_net();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) MPI_Bcast(p.data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    }
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
    // This rank's contiguous block of a shuffled order, full batches only.
    auto const n = train.inputs.size(0);
    auto const per_rank = n / size / batch_size * batch_size;
    auto const order = torch::randperm(n, torch::kLong).narrow(0, rank * per_rank, per_rank);
    net->train();
    sums fit;
    for (std::int64_t b = 0; b < per_rank; b += batch_size) {
      auto const idx = order.narrow(0, b, batch_size);
      auto const x = train.inputs.index_select(0, idx), y = train.targets.index_select(0, idx);
      opt.zero_grad();
      auto const output = net->forward(x);
      auto const loss = torch::cross_entropy_loss(output, y);
      loss.backward();
      for (auto& p : net->parameters()) {
        MPI_Allreduce(MPI_IN_PLACE, p.grad().data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        p.grad().div_(size);
      }
      opt.step();
      add(fit, output, loss, y);
    }
    fit.over_job();
    // Validation: this rank's contiguous slice of the test set, in batches of 128.
    net->eval();
    sums val;
    {
      torch::NoGradGuard no_grad;
      auto const m = test.inputs.size(0), per = (m + size - 1) / size;
      auto const lo = std::min(m, per * rank), hi = std::min(m, lo + per);
      for (auto b = lo; b < hi; b += 128) {
        auto const len = std::min<std::int64_t>(128, hi - b);
        auto const x = test.inputs.narrow(0, b, len), y = test.targets.narrow(0, b, len);
        auto const output = net->forward(x);
        add(val, output, torch::cross_entropy_loss(output, y), y);
      }
    }
    val.over_job();
    if (rank == 0) {
      std::filesystem::create_directories(storage);
      torch::save(net, (storage / "model.pt").string());
      torch::save(opt, (storage / "optimizer.pt").string());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  });
}

/// Takes --rounds, --train and --test out of argv.
sizes parse(int argc, char** argv, sizes s) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view const flag = argv[i];
    if (flag == "--rounds") s.rounds = std::atoi(argv[i + 1]);
    else if (flag == "--train") s.train = std::atoll(argv[i + 1]);
    else if (flag == "--test") s.test = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "error: unknown flag %s: use --rounds N, --train N, --test N\n", argv[i]);
      std::exit(2);
    }
  }
  if (s.rounds < 1 || s.train < 1 || s.test < 1) {
    std::fprintf(stderr, "error: --rounds, --train and --test must be positive\n");
    std::exit(2);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  cohort_bench::take_mode_flags(argc, argv);
  cohort::environment env{argc, argv};
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  sizes s = cohort_bench::guard ? sizes{.rounds = 9, .train = 4096, .test = 1024}
                                : cohort_bench::smoke ? sizes{.rounds = 1, .train = 512, .test = 256} : sizes{};
  if (!cohort_bench::guard) s = parse(argc, argv, s);
  auto const train = random_images(s.train, 1), test = random_images(s.test, 2);
  // A fresh folder shared by the ranks (rank 0's pid names it), in memory where /dev/shm is: the
  // checkpoints' fsync then waits for no disk, which other programs' writes would slow.
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  std::error_code ec;
  auto const parent = std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                                    : std::filesystem::temp_directory_path();
  auto const storage = parent / ("cohort_bench_fit_loop_" + std::to_string(pid));
  // A round of each first, not timed: thread pools, the intra-op threads the trainer sets, first-touch pages.
  cohort_epoch(train, test, storage, -1);
  handwritten_epoch(train, test, storage / "handwritten");
  std::vector<double> through, by_hand, ratios;
  for (int round = 0; round < s.rounds; ++round) {
    through.push_back(cohort_epoch(train, test, storage, round));
    by_hand.push_back(handwritten_epoch(train, test, storage / "handwritten"));
    ratios.push_back(through.back() / by_hand.back());
  }
  if (rank == 0) {
    std::filesystem::remove_all(storage, ec);
    std::printf("{\"ranks\":%d,\"libtorch\":\"%s\",\"rounds\":%d,\"train\":%lld,\"test\":%lld,\"fit_loop_epoch_s\":%.4f,"
                "\"handwritten_epoch_s\":%.4f,\"ratio\":%.4f}\n",
                size, TORCH_VERSION, s.rounds, static_cast<long long>(s.train), static_cast<long long>(s.test),
                cohort_bench::median(through), cohort_bench::median(by_hand), cohort_bench::median(ratios));
  }
  if (cohort_bench::guard)
    cohort_bench::check_guard("fit_loop epoch through the trainer / hand-written epoch (median of 9 alternating rounds)",
                              cohort_bench::median(ratios), true, 1.09);
  return cohort_bench::failed ? 1 : 0;
}
