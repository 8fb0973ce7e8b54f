// A training run for the fault-tolerance and many-host tests: checkpoints every epoch, resumes from
// the latest, and can hurt itself once, on a fresh run only: --kill-at K (the last rank SIGKILLs
// itself before report K) or --term-at K (the last rank gets SIGTERM before report K). Rank 0
// writes the final parameters to <storage>/<name>.params.json. Every rank prints its placement
// ("topology ..."); on resume rank 0 prints the epoch, the world size, the samples seen and the
// checkpoint directory it resumed from ("resumed ... from checkpoint_000002").
// --min-workers N runs elastic (scaling::cpu{.min_workers = N}); --step-ms slows each step down;
// --timeout-ms sets run_config::collective_timeout_ms; --report-at-batch N reports (and
// checkpoints) after batch N of each epoch instead of at its end, so a resume is mid-epoch.
// --shards DIR trains on the same kind of samples (60 of them) from WebDataset tar shards that rank
// 0 writes into DIR when it has none, dealt by sharding::shards with a shuffle buffer, on 2 decode
// threads: a resume must then restore the shard order, the place in each shard and the buffer.
#include <cohort/cohort.hpp>
#include <cohort/data/shard_writer.hpp>
#include <cohort/data/torch/shard_dataset.hpp>

#include "small_net.hpp"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace {

using net = cohort_test::small_net;

/// 60 samples x -> sin(sum x) as tar shards of 8 in `dir` ("x": 3 floats, "y": 1 float), written
/// by rank 0 unless there already; then a dataset of them.
cohort::shard_dataset sample_shards(std::filesystem::path const& dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0 && !std::filesystem::exists(dir / "index.json")) {
    auto x = torch::linspace(-1, 1, 180).reshape({60, 3}).contiguous();
    auto y = x.sum(1).sin().contiguous();
    cohort::data::shard_writer w(dir, {.prefix = "samples", .samples_per_shard = 8});
    for (std::int64_t i = 0; i < 60; ++i)
      w.write("s" + std::to_string(100 + i), {{"x", std::as_bytes(std::span(x.data_ptr<float>() + 3 * i, 3))},
                                              {"y", std::as_bytes(std::span(y.data_ptr<float>() + i, 1))}});
    w.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto floats = [](std::span<std::byte const> b, std::int64_t n) {
    if (b.size() != static_cast<std::size_t>(n) * sizeof(float)) throw cohort::error("wrong member size");
    auto t = torch::empty({n});
    std::memcpy(t.data_ptr<float>(), b.data(), b.size());
    return t;
  };
  return {.shards = cohort::data::shard_set::from_glob((dir / "samples-*.tar").string()),
          .transform = [floats](cohort::data::sample const& s) {
            return torch::data::Example<>{floats(s.member("x"), 3), floats(s.member("y"), 1)};
          },
          .sharding = {.seed = 3, .shuffle_buffer_samples = 5}};
}

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string storage = "runs", name = "fault", shards;
  int epochs = 5, kill_at = -1, term_at = -1, min_workers = 0, step_ms = 0, timeout_ms = 600'000, report_at_batch = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i], v = argv[i + 1];
    if (f == "--storage") storage = v;
    else if (f == "--name") name = v;
    else if (f == "--epochs") epochs = std::stoi(v);
    else if (f == "--kill-at") kill_at = std::stoi(v);
    else if (f == "--term-at") term_at = std::stoi(v);
    else if (f == "--min-workers") min_workers = std::stoi(v);
    else if (f == "--step-ms") step_ms = std::stoi(v);
    else if (f == "--timeout-ms") timeout_ms = std::stoi(v);
    else if (f == "--report-at-batch") report_at_batch = std::stoi(v);
    else if (f == "--shards") shards = v;
  }
  auto x = torch::linspace(-1, 1, 90).reshape({30, 3});
  cohort::datasets data{{"train", cohort::tensor_dataset{x, x.sum(1, true).sin()}}};
  if (!shards.empty()) data = cohort::datasets{{"train", sample_shards(shards)}};

  auto train = [&](cohort::context& ctx) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::printf("topology world_rank=%d world_size=%d node_rank=%d num_nodes=%d local_rank=%d local_world_size=%d host=%s\n",
                ctx.world_rank(), ctx.world_size(), ctx.node_rank(), ctx.num_nodes(), ctx.local_rank(),
                ctx.local_world_size(), host);
    auto const world = cohort::comm::mpi::world();  // its ring's neighbours: pieces across hosts; half-float sums round the ring
    std::printf("ring world_rank=%d right_other_node=%d left_other_node=%d across_nodes=%d\n", ctx.world_rank(),
                world.right_on_other_node() ? 1 : 0, world.left_on_other_node() ? 1 : 0, world.across_nodes() ? 1 : 0);
    std::fflush(stdout);
    torch::manual_seed(11);
    auto model = ctx.prepare_model(net());
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto& loader = ctx.dataset_shard("train", {.batch_size = 4, .num_workers = shards.empty() ? 0u : 2u});
    bool const fresh = !ctx.checkpoint();
    if (!fresh) {
      cohort::loader_state position;
      cohort::load_checkpoint(*ctx.checkpoint(), model, opt, position);
      loader.restore(position);
      if (ctx.world_rank() == 0)
        std::printf("resumed at epoch %lld with %d ranks (saved with %lld), %lld samples of the epoch seen, from %s\n",
                    static_cast<long long>(position.epoch), ctx.world_size(), static_cast<long long>(position.world_size),
                    static_cast<long long>(loader.state().samples_seen()), ctx.checkpoint()->path().filename().c_str());
    }
    bool const hurts = fresh && ctx.world_rank() == ctx.world_size() - 1;
    // One report per epoch: report k is made in epoch k - 1 (at its end, or after its batch N).
    auto reported = ctx.checkpoint() && report_at_batch > 0 ? loader.state().epoch : std::int64_t{-1};
    auto report = [&](std::int64_t next) {
      if (hurts && next == kill_at) std::raise(SIGKILL);
      if (hurts && next == term_at) std::raise(SIGTERM);
      ctx.report({{"epoch", next}}, cohort::checkpoint_of(model, opt, loader.state()));
    };
    while (loader.state().epoch < epochs) {
      for (auto& b : loader.epoch()) {
        opt.zero_grad();
        torch::mse_loss(model(b.inputs), b.targets).backward();
        opt.step();
        if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        if (report_at_batch > 0 && loader.state().position == report_at_batch && reported != loader.state().epoch) {
          reported = loader.state().epoch;
          report(reported + 1);
        }
      }
      if (report_at_batch == 0) report(loader.state().epoch);
    }
    std::vector<double> params;
    for (auto& p : model->parameters()) {
      auto f = p.detach().flatten().to(torch::kDouble);
      params.insert(params.end(), f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
    }
    if (ctx.world_rank() == 0) std::ofstream(std::filesystem::path(storage) / (name + ".params.json")) << nlohmann::json(params).dump();
  };
  auto result = cohort::trainer{train, data, cohort::sharding::shuffled{.seed = 3},
                                cohort::checkpointing::keep_last{.num_to_keep = 2}, cohort::scaling::cpu{.min_workers = min_workers}}
                    .fit(nlohmann::json::object(),
                         {.name = name, .storage_path = storage, .verbose = 0, .collective_timeout_ms = timeout_ms});
  if (result.preempted) return cohort::exit_code_preempted;
  return result.ok() ? 0 : 1;
}
