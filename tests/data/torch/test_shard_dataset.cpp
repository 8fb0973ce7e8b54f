// Shard datasets: tar shards through ctx.dataset_shard at every rank count, batches in order
// whatever the workers' timing, exact resume in and across world sizes, and bad samples.
#include <cohort/cohort.hpp>
#include <cohort/data/shard_writer.hpp>
#include <cohort/torch/fit_loop.hpp>
#include <cohort/data/torch/shard_dataset.hpp>

#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "../../catch.hpp"
#include "../../support.hpp"
#include "epoch_cover.hpp"

namespace fs = std::filesystem;

namespace {

/// `n` samples in shards of `per`, written by rank 0 into a directory every rank reads:
/// "<i>.txt" holds i, "<i>.cls" holds i % 10.
fs::path numbered_shards(std::string const& what, std::size_t n, std::size_t per) {
  auto dir = cohort_test::scratch(what);
  if (cohort_test::world_rank() == 0) {
    cohort::data::shard_writer w(dir, {.prefix = "part", .samples_per_shard = per});
    for (std::size_t i = 0; i < n; ++i) {
      auto txt = std::to_string(i), cls = std::to_string(i % 10);
      w.write("s" + std::to_string(1000000 + i),
              {{"txt", std::as_bytes(std::span(txt.data(), txt.size()))}, {"cls", std::as_bytes(std::span(cls.data(), cls.size()))}});
    }
    w.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

/// Sample i as input [i] and target i; `jitter` sleeps up to 2 ms first (thread timing noise).
cohort::sample_transform numbers(bool jitter = false) {
  return [jitter](cohort::data::sample const& s) {
    if (jitter) {
      thread_local std::mt19937 gen(std::random_device{}());
      std::this_thread::sleep_for(std::chrono::microseconds(gen() % 2000));
    }
    std::int64_t const i = std::stoll(s.text("txt"));
    return torch::data::Example<>{torch::full({1}, static_cast<float>(i)), torch::tensor(i)};
  };
}

cohort::shard_dataset dataset(fs::path const& dir, cohort::sharding::shards policy, cohort::sample_transform t = numbers()) {
  return {.shards = cohort::data::shard_set::from_glob((dir / "part-*.tar").string()), .transform = std::move(t), .sharding = policy};
}

/// Rank `rank` of `world`'s loader of `d`, as ctx.dataset_shard makes it.
cohort::data_loader<cohort::stream_dataset> loader_of(cohort::shard_dataset const& d, int world, int rank,
                                                     cohort::loader_options options) {
  auto stream = d.as_stream();
  auto dealing = *stream.impl->dealing();
  return {stream, cohort::sharding::rank_shard{dealing.first, world, rank}, options, {}, dealing.second};
}

using cohort_test::ids_of;

/// The ids handed out over `epochs` epochs (or until `stop_after` batches), in order.
std::vector<std::int64_t> run(cohort::data_loader<cohort::stream_dataset>& l, int epochs, std::int64_t stop_after = -1) {
  std::vector<std::int64_t> out;
  std::int64_t batches = 0;
  for (int e = 0; e < epochs; ++e)
    for (auto& b : l.epoch()) {
      auto ids = ids_of(b);
      out.insert(out.end(), ids.begin(), ids.end());
      if (++batches == stop_after) return out;
    }
  return out;
}

}  // namespace

TEST_CASE("a shard dataset through ctx.dataset_shard gives every rank the same batch count and covers the epoch",
          "[torch][data][shards][mpi]") {
  auto dir = numbered_shards("shard_cover", 47, 6);
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             auto& loader = ctx.dataset_shard("train", {.batch_size = 3, .num_workers = 2, .drop_last = false});
                             std::vector<std::int64_t> seen;
                             std::int64_t batches = 0;
                             for (auto& b : loader.epoch()) {
                               CHECK(torch::equal(b.inputs.squeeze(1).to(torch::kLong), b.targets));
                               auto ids = ids_of(b);
                               seen.insert(seen.end(), ids.begin(), ids.end());
                               ++batches;
                             }
                             CHECK(loader.state().epoch == 1);
                             return nlohmann::json{{"batches", batches}, {"seen", seen}};
                           },
                           cohort::datasets{{"train", dataset(dir, {.seed = 4, .shuffle_buffer_samples = 8})}}}
               .fit(nlohmann::json::object(),
                    {.name = "run", .storage_path = cohort_test::scratch("shard_cover_runs").string(), .verbose = 0});
  REQUIRE(r.ok());
  CHECK(cohort_test::samples_seen(r.return_values).size() == 47);  // pad: every sample, the last rank's block continuing from the start
}

TEST_CASE("shard batches come out in the same order whatever the workers and their timing", "[torch][data][shards]") {
  auto dir = numbered_shards("shard_order", 60, 7);
  auto d = dataset(dir, {.seed = 2, .shuffle_buffer_samples = 10}, numbers(/*jitter=*/true));
  auto reference = [&] {
    auto l = loader_of(d, 3, 1, {.batch_size = 4, .prefetch_batches = 0});
    return run(l, 2);
  }();
  CHECK(reference.size() == 2 * 20);
  for (std::size_t workers : {1, 3, 6}) {
    auto l = loader_of(d, 3, 1, {.batch_size = 4, .prefetch_batches = 2, .num_workers = workers});
    CHECK(run(l, 2) == reference);
  }
}

TEST_CASE("a shard loader restored from a state saved mid-epoch hands out exactly the rest", "[torch][data][shards]") {
  auto dir = numbered_shards("shard_resume", 53, 5);
  auto d = dataset(dir, {.seed = 8, .shuffle_buffer_samples = 7});
  for (int world : {1, 2, 3}) {
    int const rank = world - 1;
    auto whole_loader = loader_of(d, world, rank, {.batch_size = 3, .num_workers = 2});
    auto const whole = run(whole_loader, 3);
    auto const per_epoch = whole_loader.batches_per_epoch();
    for (std::int64_t stop : {std::int64_t{1}, per_epoch - 1, per_epoch + 2, 2 * per_epoch}) {
      auto first = loader_of(d, world, rank, {.batch_size = 3, .num_workers = 3});
      auto seen = run(first, 3, stop);
      auto saved = nlohmann::json(first.state()).get<cohort::loader_state>();  // through JSON, as a checkpoint holds it
      auto second = loader_of(d, world, rank, {.batch_size = 3, .prefetch_batches = 0});
      second.restore(saved);
      auto rest = run(second, 3 - static_cast<int>(saved.epoch));
      seen.insert(seen.end(), rest.begin(), rest.end());
      INFO("world " << world << ", stopped after batch " << stop);
      CHECK(seen == whole);
    }
  }
}

TEST_CASE("a shard epoch resumed at another world size trains every sample once", "[torch][data][shards]") {
  auto dir = numbered_shards("shard_elastic", 30, 4);
  auto d = dataset(dir, {.seed = 6, .shuffle_buffer_samples = 5, .on_remainder = cohort::sharding::remainder::drop});
  cohort::loader_options const o{.batch_size = 2, .drop_last = false};
  std::multiset<std::int64_t> seen;
  cohort::loader_state saved;
  for (int r = 0; r < 3; ++r) {  // 3 ranks train 2 batches of epoch 0
    auto l = loader_of(d, 3, r, o);
    auto ids = run(l, 1, 2);
    seen.insert(ids.begin(), ids.end());
    saved = l.state();
  }
  for (int r = 0; r < 2; ++r) {  // 2 ranks resume
    auto l = loader_of(d, 2, r, o);
    l.restore(saved);
    auto ids = run(l, 1);
    seen.insert(ids.begin(), ids.end());
  }
  std::multiset<std::int64_t> each_once;
  for (std::int64_t i = 0; i < 30; ++i) each_once.insert(i);
  CHECK(seen == each_once);
}

TEST_CASE("bad samples are an error naming shard and sample, or skipped and counted", "[torch][data][shards][bad-input]") {
  auto dir = numbered_shards("shard_bad", 20, 5);
  auto undecodable = [](cohort::data::sample const& s) {
    if (s.text("txt") == "7") throw cohort::error("undecodable image");
    return numbers()(s);
  };
  cohort::sharding::shards const in_order{.shuffle_shards = false};
  {
    auto l = loader_of(dataset(dir, in_order, undecodable), 1, 0, {.batch_size = 4, .num_workers = 2});
    CHECK_THROWS_WITH(run(l, 1), contains_text("part-000001.tar: sample 's1000007': undecodable image"));
  }
  {
    auto d = dataset(dir, in_order, undecodable);
    d.on_bad_sample = cohort::bad_sample::skip;
    auto l = loader_of(d, 1, 0, {.batch_size = 4, .num_workers = 2});
    auto ids = run(l, 2);
    CHECK(ids.size() == 2 * 19);
    CHECK(l.stats().skipped_samples == 2);  // once per epoch
    CHECK(l.stats().batches == 2 * 5);      // the batch count unchanged
  }
  {  // a member the transform needs is missing
    auto l = loader_of(dataset(dir, in_order,
                               [](cohort::data::sample const& s) {
                                 s.member("jpg");
                                 return numbers()(s);
                               }),
                       1, 0, {.batch_size = 4});
    CHECK_THROWS_WITH(run(l, 1), contains_text("part-000000.tar: sample 's1000000' has no member 'jpg'"));
  }
  // A shard cut short after the job listed it: its samples from the cut on are an error naming
  // it, or skipped and counted, the batch count unchanged.
  auto listed = cohort::data::shard_set::from_glob((dir / "part-*.tar").string());
  MPI_Barrier(MPI_COMM_WORLD);
  if (cohort_test::world_rank() == 0) fs::resize_file(dir / "part-000002.tar", 3 * 1024 + 200);  // in sample 11's .cls header
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_THROWS_WITH(cohort::data::shard_set::from_glob((dir / "part-*.tar").string()), contains_text("part-000002.tar has"));
  cohort::shard_dataset cut{.shards = listed, .transform = numbers(), .sharding = in_order};
  {
    auto l = loader_of(cut, 1, 0, {.batch_size = 4, .num_workers = 2});
    CHECK_THROWS_WITH(run(l, 1), contains_text("part-000002.tar: after member 's1000011.txt'") && contains_text("truncated"));
  }
  cut.on_bad_sample = cohort::bad_sample::skip;
  auto l = loader_of(cut, 1, 0, {.batch_size = 4, .num_workers = 2});
  CHECK(run(l, 1).size() == 16);
  CHECK(l.stats().skipped_samples == 4);  // samples 11-14
  CHECK(l.stats().batches == 5);
}

TEST_CASE("fit_loop reports the job's skipped samples of a shard dataset, every batch still trained",
          "[torch][data][shards][mpi]") {
  // 24 samples, batches of 2: at 1-4 ranks every sample is in a batch, sample 7 (undecodable) once.
  auto dir = numbered_shards("shard_fit_skip", 24, 5);
  auto d = dataset(dir, {.seed = 1, .shuffle_buffer_samples = 4}, [](cohort::data::sample const& s) {
    if (s.text("txt") == "7") throw cohort::error("undecodable image");
    auto ex = numbers()(s);
    return torch::data::Example<>{ex.data.expand({4}).clone(), ex.target % 3};
  });
  d.on_bad_sample = cohort::bad_sample::skip;
  cohort::fit_loop loop{[] {
                          torch::manual_seed(0);
                          return torch::nn::Linear(4, 3);
                        },
                        [](std::vector<torch::Tensor> p) { return torch::optim::SGD(p, torch::optim::SGDOptions(0.01)); }, torch::nn::CrossEntropyLoss(),
                        cohort::fit_options{.batch_size = 2, .epochs = 2, .num_workers = 2, .checkpoint_every_epochs = 0}};
  auto r = cohort::trainer{loop, cohort::datasets{{"train", d}}}.fit(
      nlohmann::json::object(), {.name = "run", .storage_path = cohort_test::scratch("shard_fit_skip_runs").string(), .verbose = 0});
  REQUIRE(r.ok());
  CHECK(r.metrics["train_skipped_samples"] == 1);  // the last epoch's, summed over the ranks
  auto rows = std::ifstream(r.path / "result.json");
  int reported = 0;
  for (std::string line; std::getline(rows, line);)
    if (nlohmann::json::parse(line).value("train_skipped_samples", 0.0) == 1) ++reported;
  CHECK(reported == 2);  // in both epochs
}
