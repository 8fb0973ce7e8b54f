// cohort::fit_loop against the loop it replaces: the same weights as a hand-written loop, metrics
// of the whole job, an exact resume, and each override point used.
#include <cohort/cohort.hpp>
#include <cohort/torch/fit_loop.hpp>
#include <cohort/tuning/tuner.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

using cohort_test::world_rank;
using cohort_test::world_size;

struct loop_config {
  double lr = 0.1;
  std::int64_t epochs = 2;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(loop_config, lr, epochs)

// 8 features -> 16 (ReLU) -> 3 classes; the same initial weights on every call.
torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
}

// `n` samples labelled by one fixed linear teacher (so training on one set helps on another);
// 48 training samples: with batches of 4, every world size of 1-4 ranks takes them all.
cohort::tensor_dataset make_data(std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(0);
  auto const teacher = torch::randn({8, 3});
  torch::manual_seed(seed);
  auto x = torch::randn({n, 8});
  return {x, x.matmul(teacher).argmax(1)};
}

torch::optim::SGD make_sgd(std::vector<torch::Tensor> params, loop_config const& c) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(c.lr).momentum(0.9));
}

auto make_loop(cohort::fit_options options) {
  return cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(), options};
}

cohort::run_config run_in(std::filesystem::path const& storage, std::string name) {
  return {.name = std::move(name), .storage_path = storage.string(), .verbose = 0};
}

std::vector<double> flat(torch::nn::Module const& m) {
  std::vector<double> out;
  for (auto const& p : m.parameters()) {
    auto c = p.detach().to(torch::kDouble).contiguous();
    out.insert(out.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return out;
}

// The weights of a run's latest checkpoint.
std::vector<double> weights_of(cohort::checkpoint_info const& ck) {
  auto net = make_net();
  cohort::load_checkpoint(cohort::checkpoint::from_directory(ck.path), net);
  return flat(*net);
}

double max_difference(std::vector<double> const& a, std::vector<double> const& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

auto const train_set = make_data(48, 1);
auto const val_set = make_data(30, 2);  // 30: not a multiple of 4, so the ranks' slices differ in size

}  // namespace

TEST_CASE("fit_loop trains to the hand-written loop's weights", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_equal");
  // The loop a user would write: the same model, optimizer, loss, data, batches and epochs.
  auto manual = [](cohort::context& ctx, loop_config const& c) {
    auto model = ctx.prepare_model(make_net());
    auto opt = make_sgd(model->parameters(), c);
    auto& loader = ctx.dataset_shard("train", {.batch_size = 4, .prefetch_batches = 2});
    while (loader.state().epoch < c.epochs) {
      model->train();
      for (auto& b : loader.epoch()) {
        opt.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(b.inputs), b.targets).backward();
        opt.step();
      }
      ctx.report({{"epoch", loader.state().epoch}});
    }
    return flat(*model);
  };
  cohort::trainer by_hand{manual, cohort::datasets{{"train", train_set}}, cohort::sharding::shuffled{.seed = 7}};
  auto expected = by_hand.fit(loop_config{}, run_in(storage, "manual"));
  REQUIRE(expected.ok());

  cohort::trainer looped{make_loop({.batch_size = 4, .epochs = 2}), cohort::datasets{{"train", train_set}},
                         cohort::sharding::shuffled{.seed = 7}};
  auto got = looped.fit(loop_config{}, run_in(storage, "loop"));
  REQUIRE(got.ok());
  REQUIRE(got.checkpoint);
  // Catches a loop that skips or repeats batches, averages gradients differently, or steps twice.
  CHECK(max_difference(weights_of(*got.checkpoint), expected.return_values.at(0)) < 1e-6);
  CHECK(got.metrics_history.size() == 2);
  CHECK(got.metrics.at("epoch") == 1);
  CHECK(got.metrics.contains("train_loss"));
  CHECK(got.metrics.contains("train_accuracy"));
  CHECK_FALSE(got.metrics.contains("val_loss"));
}

TEST_CASE("fit_loop's metrics are the whole job's, not rank 0's", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_global");
  // lr 0: the weights stay the initial ones, so every metric can be computed here on one process.
  cohort::trainer t{make_loop({.batch_size = 4, .epochs = 1, .validation = "val", .checkpoint_every_epochs = 0}),
                    cohort::datasets{{"train", train_set}, {"val", val_set}}};
  auto r = t.fit(loop_config{.lr = 0.0, .epochs = 1}, run_in(storage, "global"));
  REQUIRE(r.ok());
  auto net = make_net();
  net->eval();
  torch::NoGradGuard no_grad;
  auto score = [&](cohort::tensor_dataset const& d) {
    auto out = net->forward(d.inputs);
    return std::pair{torch::nn::functional::cross_entropy(out, d.targets).item<double>(),
                     out.argmax(1).eq(d.targets).sum().item<double>() / static_cast<double>(d.size())};
  };
  auto [val_loss, val_accuracy] = score(val_set);
  auto [train_loss, train_accuracy] = score(train_set);
  // At 2-4 ranks a rank-0-only metric would score 1/N of the data and differ.
  CHECK(r.metrics.at("val_loss").get<double>() == Approx(val_loss).epsilon(1e-6));
  CHECK(r.metrics.at("val_accuracy").get<double>() == Approx(val_accuracy).epsilon(1e-12));
  CHECK(r.metrics.at("train_loss").get<double>() == Approx(train_loss).epsilon(1e-6));
  CHECK(r.metrics.at("train_accuracy").get<double>() == Approx(train_accuracy).epsilon(1e-12));
  CHECK_FALSE(r.checkpoint);  // checkpoint_every_epochs = 0
}

TEST_CASE("fit_loop resumes mid-run exactly where it stopped", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_resume");
  auto options = [](loop_config const& c) { return cohort::fit_options{.batch_size = 4, .epochs = c.epochs}; };
  auto trainer_of = [&] {
    return cohort::trainer{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(), options},
                           cohort::datasets{{"train", train_set}}, cohort::sharding::shuffled{.seed = 3}};
  };
  auto straight = trainer_of().fit(loop_config{.epochs = 3}, run_in(storage, "straight"));
  REQUIRE(straight.ok());
  auto first = trainer_of().fit(loop_config{.epochs = 1}, run_in(storage, "resumed"));
  REQUIRE(first.ok());
  CHECK(first.metrics_history.size() == 1);
  auto rest = trainer_of().fit(loop_config{.epochs = 3}, run_in(storage, "resumed"));  // the same name: resumes
  REQUIRE(rest.ok());
  REQUIRE(rest.checkpoint);
  CHECK(rest.metrics_history.size() == 3);  // epoch 0 from the first fit, 1 and 2 from this one
  CHECK(rest.metrics_history.front().at("epoch") == 0);
  // Catches a resume that restarts the epoch count, the data order or the momentum buffers.
  CHECK(max_difference(weights_of(*rest.checkpoint), weights_of(*straight.checkpoint)) == 0.0);
}

TEST_CASE("fit_loop's loss scaling skips the steps that overflow, backs off, and resumes with its scale", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_scaling");
  // From 2^150 the scaled loss is inf (float32 ends below 2^128): that step is skipped and the
  // scale drops to 2^130, still inf, then to 2^110, where every step is finite.
  auto options = [](loop_config const& c) {
    return cohort::fit_options{.batch_size = 4, .epochs = c.epochs, .precision = cohort::mixed_precision::bfloat16,
                               .loss_scaling = cohort::grad_scaler_options{.init_scale = 0x1p150, .backoff_factor = 0x1p-20}};
  };
  auto trainer_of = [&] {
    return cohort::trainer{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(), options},
                           cohort::datasets{{"train", train_set}}, cohort::sharding::shuffled{.seed = 5}};
  };
  auto straight = trainer_of().fit(loop_config{.epochs = 2}, run_in(storage, "straight"));
  REQUIRE(straight.ok());
  auto first = trainer_of().fit(loop_config{.epochs = 1}, run_in(storage, "resumed"));
  REQUIRE(first.ok());
  // Catches steps taken on inf gradients, a scale that does not back off, metrics of one rank.
  CHECK(first.metrics.at("train_skipped_steps") == 2);
  CHECK(first.metrics.at("loss_scale") == 0x1p110);
  CHECK(std::isfinite(first.metrics.at("train_loss").get<double>()));
  auto rest = trainer_of().fit(loop_config{.epochs = 2}, run_in(storage, "resumed"));
  REQUIRE(rest.ok());
  REQUIRE(rest.checkpoint);
  // Catches a checkpoint without the scale: a resumed run would start again from 2^150 and skip.
  CHECK(rest.metrics.at("train_skipped_steps") == 0);
  CHECK(rest.metrics.at("loss_scale") == 0x1p110);
  CHECK(max_difference(weights_of(*rest.checkpoint), weights_of(*straight.checkpoint)) == 0.0);
}

TEST_CASE("fit_loop leaves the weights alone on steps whose gradients overflow", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_overflow");
  // Halving from 2^150 stays above 2^128 for more steps than an epoch has: every step is skipped.
  cohort::trainer t{make_loop({.batch_size = 4, .epochs = 1,
                               .loss_scaling = cohort::grad_scaler_options{.init_scale = 0x1p150}}),
                    cohort::datasets{{"train", train_set}}};
  auto r = t.fit(loop_config{}, run_in(storage, "overflow"));
  REQUIRE(r.ok());
  REQUIRE(r.checkpoint);
  CHECK(r.metrics.at("train_skipped_steps") == 48 / (4 * world_size()));
  CHECK(max_difference(weights_of(*r.checkpoint), flat(*make_net())) == 0.0);
}

TEST_CASE("fit_loop clips the unscaled gradients to max_grad_norm", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_clip");
  // One step of SGD at lr 1 (the first momentum step is the gradient): the weights move by the
  // clipped gradient, whose norm is max_grad_norm. Clipping the scaled gradients (before
  // unscale) would move them 2^10 times less; no clipping, by the gradient's norm (~0.1-1).
  cohort::trainer t{make_loop({.batch_size = 48 / world_size(), .epochs = 1,
                               .loss_scaling = cohort::grad_scaler_options{.init_scale = 0x1p10}, .max_grad_norm = 1e-3}),
                    cohort::datasets{{"train", train_set}}};
  auto r = t.fit(loop_config{.lr = 1.0, .epochs = 1}, run_in(storage, "clip"));
  REQUIRE(r.ok());
  REQUIRE(r.checkpoint);
  auto const after = weights_of(*r.checkpoint), before = flat(*make_net());
  double moved = 0;
  for (std::size_t i = 0; i < after.size(); ++i) moved += (after[i] - before[i]) * (after[i] - before[i]);
  CHECK(std::sqrt(moved) == Approx(1e-3).epsilon(1e-3));
}

TEST_CASE("fit_loop refuses float16 on the CPU and a negative max_grad_norm", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_precision");
  cohort::trainer half{make_loop({.precision = cohort::mixed_precision::float16}), cohort::datasets{{"train", train_set}}};
  auto r = half.fit(loop_config{}, run_in(storage, "half"));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("float16 needs a CUDA device"));
  cohort::trainer clip{make_loop({.max_grad_norm = -1}), cohort::datasets{{"train", train_set}}};
  auto c = clip.fit(loop_config{}, run_in(storage, "clip"));
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(*c.error, contains_text("max_grad_norm must be >= 0"));
}

namespace {

// Replaces both steps, counting them; the training step records the learning rate it ran with.
struct counting_steps {
  std::shared_ptr<std::int64_t> trained = std::make_shared<std::int64_t>(0), validated = std::make_shared<std::int64_t>(0);
  std::shared_ptr<std::vector<double>> lrs = std::make_shared<std::vector<double>>();

  template <class State>
  cohort::step_metrics train_step(State& s, cohort::batch& b) {
    ++*trained;
    auto const lr = static_cast<torch::optim::SGDOptions&>(s.optimizer.param_groups().at(0).options()).lr();
    if (lrs->empty() || lrs->back() != lr) lrs->push_back(lr);
    s.optimizer.zero_grad();
    auto loss = s.loss(s.model->forward(b.inputs), b.targets);
    loss.backward();
    s.optimizer.step();
    return {.loss_sum = 1.0 * static_cast<double>(b.inputs.size(0)), .correct = 0, .samples = b.inputs.size(0)};
  }
  template <class State>
  cohort::step_metrics validate_step(State&, cohort::batch& b) {
    ++*validated;
    return {.loss_sum = 2.0 * static_cast<double>(b.inputs.size(0)), .correct = b.inputs.size(0), .samples = b.inputs.size(0)};
  }
};

// A torch::data dataset over the same tensors (get(i), size()).
struct toy_dataset : torch::data::datasets::Dataset<toy_dataset> {
  cohort::tensor_dataset d;
  explicit toy_dataset(cohort::tensor_dataset t) : d(std::move(t)) {}
  torch::data::Example<> get(std::size_t i) override {
    auto const k = static_cast<std::int64_t>(i);
    return {d.inputs[k], d.targets[k]};
  }
  decltype(std::declval<torch::data::datasets::Dataset<toy_dataset> const&>().size()) size() const override { return d.size(); }
};

}  // namespace

TEST_CASE("fit_loop's parts replace its steps, stop it early and schedule the learning rate", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_parts");
  counting_steps steps;
  int hook_calls = 0;
  cohort::trainer t{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(),
                                     cohort::fit_options{.batch_size = 4, .epochs = 5, .validation = "val"}, steps,
                                     cohort::lr_schedule([](torch::optim::Optimizer& o) { return torch::optim::StepLR(o, 1, 0.5); }),
                                     cohort::on_epoch_end([&](cohort::context&, nlohmann::json& m) {
                                       m["hook_calls"] = ++hook_calls;
                                       return m.at("epoch").get<int>() == 2;  // early stopping after the third epoch
                                     })},
                    cohort::datasets{{"train", train_set}, {"val", val_set}}};
  auto r = t.fit(loop_config{}, run_in(storage, "parts"));
  REQUIRE(r.ok());
  CHECK(r.metrics_history.size() == 3);  // stopped by the hook, not by epochs = 5
  CHECK(r.metrics.at("hook_calls") == 3);
  CHECK(r.checkpoint);  // the stopping epoch is checkpointed
  auto const per_rank = 48 / world_size() / 4;  // batches per epoch on each rank
  CHECK(*steps.trained == 3 * per_rank);
  CHECK(*steps.validated > 0);
  CHECK(r.metrics.at("train_loss") == 1.0);  // the part's metrics, summed over the job
  CHECK(r.metrics.at("val_loss") == 2.0);
  CHECK(r.metrics.at("val_accuracy") == 1.0);
  // LibTorch's StepLR leaves its first step() a no-op (PyTorch's constructor takes that step), so
  // with a step after every epoch the rate is halved from the third epoch on.
  REQUIRE(steps.lrs->size() == 2);
  CHECK(steps.lrs->at(0) == Approx(0.1));
  CHECK(steps.lrs->at(1) == Approx(0.05));
}

TEST_CASE("fit_loop trains on a torch::data dataset as on the same tensors", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_torch_data");
  cohort::trainer named{make_loop({.batch_size = 4, .epochs = 1, .validation = "val"}),
                        cohort::datasets{{"train", train_set}, {"val", val_set}}};
  auto a = named.fit(loop_config{}, run_in(storage, "named"));
  cohort::trainer held{cohort::fit_loop{make_net, make_sgd, torch::nn::CrossEntropyLoss(),
                                        cohort::fit_options{.batch_size = 4, .epochs = 1},
                                        cohort::train_data(toy_dataset(train_set)), cohort::validation_data(toy_dataset(val_set))}};
  auto b = held.fit(loop_config{}, run_in(storage, "held"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(max_difference(weights_of(*a.checkpoint), weights_of(*b.checkpoint)) < 1e-6);
  CHECK(b.metrics.at("val_accuracy").get<double>() == Approx(a.metrics.at("val_accuracy").get<double>()));
}

TEST_CASE("fit_loop names the missing dataset", "[fit_loop][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_missing");
  cohort::trainer t{make_loop({.batch_size = 4, .epochs = 1, .validation = "test"}), cohort::datasets{{"train", train_set}}};
  auto r = t.fit(loop_config{}, run_in(storage, "missing"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->find("fit_options.validation names no dataset 'test'") != std::string::npos);
}

TEST_CASE("the tuner runs fit_loop trials", "[fit_loop][tuning][mpi]") {
  auto const storage = cohort_test::scratch("fit_loop_tune");
  cohort::tuner tuner{cohort::trainer{make_loop({.batch_size = 4, .epochs = 2, .validation = "val"}),
                                      cohort::datasets{{"train", train_set}, {"val", val_set}}},
                      cohort::tune_config{.metric = "val_loss", .mode = cohort::min, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"lr", cohort::grid_search({0.0, 0.1})}, {"epochs", 2}},
                        {.name = "tune", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 2);
  for (auto const& trial : grid.trials) CHECK(trial.metrics_history.size() == 2);
  CHECK(grid.best_result().config.at("lr") == 0.1);  // training beats not training
}
