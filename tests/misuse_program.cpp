// The misuse catalogue's training run (tests/misuse.sh): a small model trained with a checkpoint
// every epoch, whose last rank misbehaves in the first epoch of a resumed run (so that the
// checkpoints committed before are there to be checked afterwards). `--case NAME` picks the
// misuse; `--case none` trains normally; NAME_async runs it with asynchronous checkpoints (a
// `throws` then comes right after the report, while its checkpoint is being written), and
// NAME_by_rank0 has rank 0, which owns the run directory and writes the checkpoints, misbehave
// instead of the last rank. The misbehaving rank writes <storage>/<name>.t0 (the
// time, in ms since the epoch) just before it misbehaves: the script measures how long the job
// takes to end from there. `--verify DIR` checks a committed checkpoint against its manifest.
#include <cohort/cohort.hpp>

#include "small_net.hpp"

#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace {

using net = cohort_test::small_net;

void stamp(std::filesystem::path const& file) {
  auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  std::ofstream(file) << ms.count() << "\n";
}

/// A checkpoint of this rank's own state (sharded): one file per rank.
cohort::checkpoint_payload per_rank_state(std::int64_t epoch) {
  return {.write = [epoch](std::filesystem::path const& dir, int rank) {
            std::ofstream(dir / ("shard_" + std::to_string(rank) + ".json")) << nlohmann::json{{"epoch", epoch}}.dump();
          },
          .scope = cohort::checkpoint_scope::per_rank};
}

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string storage = "runs", name = "misuse", what = "none";
  int epochs = 4, timeout_ms = -1;
  bool async = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i], v = argv[i + 1];
    if (f == "--storage") storage = v;
    else if (f == "--name") name = v;
    else if (f == "--case") what = v;  // NAME_async: NAME with checkpoint_mode::async
    else if (f == "--epochs") epochs = std::stoi(v);
    else if (f == "--timeout-ms") timeout_ms = std::stoi(v);
    else if (f == "--async") async = v == "1";
    else if (f == "--verify") {
      auto problem = cohort::checkpointing::verify(v);
      std::cout << (problem ? "corrupt: " + *problem : std::string("verified")) << "\n";
      return problem ? 1 : 0;
    }
  }
  bool const on_rank0 = what.ends_with("_by_rank0");
  if (on_rank0) what.resize(what.size() - 9);
  if (what.ends_with("_async")) {
    what.resize(what.size() - 6);
    async = true;
  }
  auto x = torch::linspace(-1, 1, 72).reshape({24, 3});
  cohort::tensor_dataset data{x, x.sum(1, true).sin()};
  auto const marker = std::filesystem::path(storage) / (name + "." + what + ".done");  // misbehave once

  auto train = [&](cohort::context& ctx) {
    torch::manual_seed(5);
    int const me = ctx.world_rank();
    bool const odd = me == (on_rank0 ? 0 : ctx.world_size() - 1);  // the rank that misbehaves
    // The first epoch of a resumed run, the first time: where the odd rank misbehaves.
    bool const now = ctx.checkpoint().has_value() && !std::filesystem::exists(marker);
    bool const hurts = odd && now;
    auto misbehave = [&](std::string const& c) {
      if (!hurts || what != c) return false;
      std::ofstream(marker) << "\n";
      stamp(std::filesystem::path(storage) / (name + ".t0"));
      return true;
    };
    net raw;
    if (misbehave("layout_mismatch")) raw->register_parameter("extra", torch::zeros({2}));
    auto model = misbehave("missing_prepare_model") ? cohort::prepared_model<net>(raw, nullptr) : ctx.prepare_model(raw);
    torch::optim::SGD opt(model->parameters(), 0.05);
    auto& loader = ctx.dataset_shard("train", {.batch_size = 4});
    if (ctx.checkpoint()) {
      cohort::loader_state position;
      cohort::load_checkpoint(*ctx.checkpoint(), model, opt, position);
      loader.restore(position);
      if (me == 0) std::cout << "[misuse] resumed from " << ctx.checkpoint()->path().filename().string() << "\n" << std::flush;
    }
    while (loader.state().epoch < epochs) {
      bool first_batch = true;
      for (auto& b : loader.epoch()) {
        auto inputs = b.inputs;
        auto targets = b.targets;
        if (what == "zero_size_batch" && odd && first_batch) {  // an empty batch on one rank, every epoch: it must train
          inputs = inputs.narrow(0, 0, 0);
          targets = targets.narrow(0, 0, 0);
        }
        opt.zero_grad();
        auto loss = torch::mse_loss(model(inputs), targets, torch::Reduction::Sum) / 4.0;
        if (what == "no_sync_on_one_rank" && misbehave("no_sync_on_one_rank")) {
          auto guard = model.no_sync();
          loss.backward();
        } else {
          loss.backward();
        }
        opt.step();
        if (first_batch && misbehave("extra_backward")) {
          opt.zero_grad();
          torch::mse_loss(model(b.inputs), b.targets).backward();
          opt.step();
        }
        first_batch = false;
      }
      if (misbehave("extra_report")) ctx.report({{"extra", true}});
      if (misbehave("early_return")) return;
      if (!async && misbehave("throws")) throw std::runtime_error("boom on rank " + std::to_string(me));
      if (misbehave("sigstop")) std::raise(SIGSTOP);
      if (misbehave("sigkill")) std::raise(SIGKILL);
      if (misbehave("extra_collective")) ctx.comm().barrier();
      if (misbehave("bad_metrics")) ctx.report(nlohmann::json::array({1, 2}));
      auto const state = loader.state();  // after the epoch: what a resume continues from
      nlohmann::json metrics{{"epoch", state.epoch}};
      if (what == "rank0_checkpoint") {  // Ray's idiom: the checkpoint on rank 0 only
        if (me == 0) ctx.report(metrics, cohort::checkpoint_of(model, opt, state));
        else ctx.report({});
      } else if (what == "per_rank_checkpoint_missing" && now) {  // sharded state, missing on the last rank
        if (!odd) ctx.report(metrics, per_rank_state(state.epoch));
        else if (misbehave("per_rank_checkpoint_missing")) ctx.report(metrics);
      } else if (what == "checkpoint_not_on_rank0" && now) {  // replicated state passed on the last rank only
        if (misbehave("checkpoint_not_on_rank0")) ctx.report(metrics, cohort::checkpoint_of(model, opt, state));
        else ctx.report(metrics);
      } else {
        ctx.report(metrics, cohort::checkpoint_of(model, opt, state));
      }
      if (async && misbehave("throws")) throw std::runtime_error("boom on rank " + std::to_string(me));  // mid-write
    }
  };
  cohort::run_config run{.name = name, .storage_path = storage, .verbose = 0};
  if (timeout_ms >= 0) run.collective_timeout_ms = timeout_ms;
  if (async) run.checkpoint_mode = cohort::checkpoint_mode::async;
  auto result = cohort::trainer{train, cohort::datasets{{"train", data}}, cohort::sharding::shuffled{.seed = 3}}.fit(
      nlohmann::json::object(), run);
  return result.ok() ? 0 : 1;
}
