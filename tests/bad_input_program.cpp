// The program of the bad-input catalogue (tests/bad_input.sh): a small training run, or a small
// tuning run, whose every input can be given bad: the config (--config FILE, a params.json), the
// checkpoints it resumes from (its run directory, or --resume DIR), the model it loads them into
// (--width: the hidden layer), the optimizer (--optimizer sgd|adam), a CSV data file (--csv FILE,
// three feature columns and a label), the storage (--storage DIR), and for tuning (--search) the
// search space (--low/--high of a uniform learning rate) and --samples. It checkpoints every epoch
// and keeps every checkpoint, so a catalogue case can check that none committed before is lost.
// Rank 0 prints "resumed from <checkpoint>" when it resumed, "trained <N> epochs" at the end.
// `--verify DIR` exits 0 when DIR is a committed checkpoint that verifies.
#include <cohort/cohort.hpp>
#include <cohort/data/csv.hpp>
#include <cohort/tuning/tuner.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

namespace {

struct config {
  double lr = 0.05;
  int epochs = 2;
  int width = 6;
  std::string optimizer = "sgd";
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(config, lr, epochs, width, optimizer)

struct netImpl : torch::nn::Module {
  explicit netImpl(int width)
      : l1(register_module("l1", torch::nn::Linear(3, width))), l2(register_module("l2", torch::nn::Linear(width, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return l2(torch::tanh(l1(x))); }
  torch::nn::Linear l1, l2;
};
TORCH_MODULE(net);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(config const& c, std::vector<torch::Tensor> params) {
  if (c.optimizer == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(c.lr));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr).momentum(0.9));
}

void train(cohort::context& ctx, config const& c) {
  torch::manual_seed(11);
  auto model = ctx.prepare_model(net(c.width));
  auto opt = make_optimizer(c, model->parameters());
  auto& loader = ctx.dataset_shard("train", {.batch_size = 4});
  if (auto const& ck = ctx.checkpoint()) {
    cohort::loader_state position;
    cohort::load_checkpoint(*ck, model, *opt, position);
    loader.restore(position);
    if (ctx.world_rank() == 0) std::printf("resumed from %s\n", ck->path().filename().string().c_str());
  }
  while (loader.state().epoch < c.epochs) {
    for (auto& b : loader.epoch()) {
      opt->zero_grad();
      torch::mse_loss(model(b.inputs), b.targets).backward();
      opt->step();
    }
    ctx.report({{"epoch", loader.state().epoch}}, cohort::checkpoint_of(model, *opt, loader.state()));
  }
  if (ctx.world_rank() == 0) std::printf("trained %d epochs\n", c.epochs);
}

struct step_lr {
  double lr = 0;
  int steps = 0;
  void setup(nlohmann::json const& cfg) { lr = cfg.at("lr").get<double>(); }
  nlohmann::json step() { return {{"score", lr * ++steps}, {"done", steps >= 2}}; }
  void save_checkpoint(std::filesystem::path const& dir) const { std::ofstream(dir / "steps.json") << steps; }
  void load_checkpoint(std::filesystem::path const& dir) { std::ifstream(dir / "steps.json") >> steps; }
};

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto fail = [&](std::string const& what) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + what + "\n");
    return 1;
  };
  cohort::run_config run{.name = "run", .storage_path = "runs", .verbose = 0, .collective_timeout_ms = 20'000};
  std::string config_file, csv_file;
  config cfg;
  bool tune = false, async = false;
  double low = 0.1, high = 0.5;
  std::size_t samples = 2;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--search") { tune = true; continue; }
    if (f == "--async") { async = true; continue; }
    if (i + 1 >= argc) return fail("flag " + f + " needs a value");
    std::string v = argv[++i];
    if (f == "--verify") return cohort::checkpointing::verify(v) ? 1 : 0;
    if (f == "--storage") run.storage_path = v;
    else if (f == "--name") run.name = v;
    else if (f == "--resume") run.resume_from_checkpoint = v;
    else if (f == "--config") config_file = v;
    else if (f == "--csv") csv_file = v;
    else if (f == "--epochs") cfg.epochs = std::stoi(v);
    else if (f == "--width") cfg.width = std::stoi(v);
    else if (f == "--optimizer") cfg.optimizer = v;
    else if (f == "--low") low = std::stod(v);
    else if (f == "--high") high = std::stod(v);
    else if (f == "--samples") samples = std::stoul(v);
    else return fail("unknown flag " + f);
  }
  if (async) run.checkpoint_mode = cohort::checkpoint_mode::async;
  try {
    if (tune) {
      cohort::tuner tuner{step_lr{}, cohort::tune_config{.metric = "score", .num_samples = samples}};
      auto grid = tuner.fit(cohort::space{{"lr", cohort::uniform(low, high)}}, run);
      return grid.ok() ? 0 : 1;
    }
    auto x = torch::linspace(-1, 1, 48).reshape({16, 3});
    cohort::tensor_dataset data{x, x.sum(1, true).sin()};
    if (!csv_file.empty()) {
      auto t = cohort::data::read_csv(csv_file);
      if (t.columns.size() != 3) return fail(csv_file + ": " + std::to_string(t.columns.size()) + " feature columns, the model takes 3");
      auto features = torch::from_blob(t.features.data(), {static_cast<long>(t.rows), 3}, torch::kFloat).clone();
      auto labels = torch::from_blob(t.labels.data(), {static_cast<long>(t.rows), 1}, torch::kLong).to(torch::kFloat);
      data = cohort::tensor_dataset{features, labels};
    }
    cohort::trainer trainer{train, cohort::datasets{{"train", data}}, cohort::sharding::shuffled{.seed = 3},
                            cohort::checkpointing::keep_all{}};
    auto result = [&] {
      if (config_file.empty()) return trainer.fit(cfg, run);
      std::ifstream in(config_file);
      if (!in) throw cohort::error(config_file + ": cannot open: check the path");
      auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded()) throw cohort::error(config_file + ": not JSON: check the file");
      return trainer.fit(j, run);
    }();
    return result.ok() ? 0 : 1;
  } catch (cohort::error const& e) {
    return fail(e.what());
  }
}
