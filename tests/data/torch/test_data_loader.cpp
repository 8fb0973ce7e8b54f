// Sharded, prefetching loaders: coverage and equal counts across ranks, prefetch transparency,
// exact resume, torch::data adaptation and bad input.
#include <cohort/cohort.hpp>

#include <set>

#include "../../catch.hpp"
#include "../../support.hpp"
#include "epoch_cover.hpp"

namespace {

/// Sample i has input [i, -i] and target i.
cohort::tensor_dataset numbered(std::int64_t n) {
  auto ids = torch::arange(n, torch::kLong);
  return {torch::stack({ids.to(torch::kFloat), -ids.to(torch::kFloat)}, 1), ids};
}

std::function<std::vector<std::size_t>(std::size_t, std::int64_t)> one_of(int world, int rank, std::uint64_t seed) {
  return [=](std::size_t n, std::int64_t e) { return cohort::sharding::shuffled{.seed = seed}.indices(n, world, rank, e); };
}

/// An elastic shard (it can deal an epoch again at another world size) of shuffled{.seed = seed}.
cohort::sharding::rank_shard shuffled_shard(int world, int rank, std::uint64_t seed) {
  return cohort::sharding::rank_shard{[seed](std::size_t n, int w, int r, std::int64_t e) {
                                        return cohort::sharding::shuffled{.seed = seed}.indices(n, w, r, e);
                                      },
                                      world, rank};
}

using cohort_test::ids_of;

using cohort_test::quiet;

struct squares : torch::data::datasets::Dataset<squares> {
  torch::data::Example<> get(std::size_t i) override {
    return {torch::full({3}, static_cast<float>(i * i)), torch::tensor(static_cast<std::int64_t>(i))};
  }
  torch::optional<std::size_t> size() const override { return 10; }
};

}  // namespace

TEST_CASE("dataset shards give every rank the same batch count and together cover every sample", "[torch][data][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             auto& loader = ctx.dataset_shard("train", {.batch_size = 2, .prefetch_batches = 2, .drop_last = false});
                             std::vector<std::int64_t> seen;
                             std::int64_t batches = 0;
                             for (auto& b : loader.epoch()) {
                               CHECK(b.inputs.size(1) == 2);
                               CHECK(torch::equal(b.inputs.select(1, 0).to(torch::kLong), b.targets));
                               auto ids = ids_of(b);
                               seen.insert(seen.end(), ids.begin(), ids.end());
                               ++batches;
                             }
                             CHECK(loader.state().epoch == 1);  // the epoch advanced by itself
                             return nlohmann::json{{"batches", batches}, {"seen", seen}};
                           },
                           cohort::datasets{{"train", numbered(23)}}, cohort::sharding::shuffled{.seed = 9}}
               .fit(nlohmann::json::object(), quiet("loader_cover"));
  REQUIRE(r.ok());
  CHECK(cohort_test::samples_seen(r.return_values).size() == 23);
}

TEST_CASE("prefetching does not change the batches", "[torch][data]") {
  auto run = [](std::size_t prefetch) {
    cohort::data_loader<cohort::tensor_dataset> l(numbered(50), one_of(3, 1, 4), {.batch_size = 4, .prefetch_batches = prefetch});
    std::vector<std::int64_t> out;
    for (int e = 0; e < 2; ++e)
      for (auto& b : l.epoch())
        for (auto id : ids_of(b)) out.push_back(id);
    return out;
  };
  auto plain = run(0);
  CHECK(plain.size() == 2 * 4 * 4);  // 17 samples per rank -> 4 full batches per epoch
  CHECK(run(1) == plain);
  CHECK(run(8) == plain);
}

TEST_CASE("a restored loader position continues with exactly the uninterrupted sequence", "[torch][data]") {
  auto make = [] { return cohort::data_loader<cohort::tensor_dataset>(numbered(40), one_of(2, 0, 7), {.batch_size = 3}, {}, 7); };
  auto uninterrupted = make();
  std::vector<std::int64_t> expected;
  for (int e = 0; e < 3; ++e)
    for (auto& b : uninterrupted.epoch())
      for (auto id : ids_of(b)) expected.push_back(id);

  std::vector<std::int64_t> got;
  nlohmann::json saved;
  {
    auto first = make();
    for (auto& b : first.epoch()) {  // epoch 0 in full
      for (auto id : ids_of(b)) got.push_back(id);
    }
    for (auto& b : first.epoch()) {  // epoch 1, interrupted after 4 batches
      for (auto id : ids_of(b)) got.push_back(id);
      if (first.state().position == 4) break;
    }
    saved = first.state();
  }
  CHECK(saved == nlohmann::json{{"epoch", 1}, {"position", 4}, {"seed", 7}, {"world_size", 0}, {"batch_size", 3},
                                {"epoch_world_size", 0}, {"epoch_offset", 0}, {"epoch_end", 0}, {"dataset_size", 40}});
  auto resumed = make();
  resumed.restore(saved.get<cohort::loader_state>());
  while (resumed.state().epoch < 3)
    for (auto& b : resumed.epoch())
      for (auto id : ids_of(b)) got.push_back(id);
  CHECK(got == expected);
  auto other_seed = cohort::data_loader<cohort::tensor_dataset>(numbered(40), one_of(2, 0, 8), {.batch_size = 3}, {}, 8);
  CHECK_THROWS_WITH(other_seed.restore(saved.get<cohort::loader_state>()), contains_text("saved with sharding seed 7"));
  auto more_data = cohort::data_loader<cohort::tensor_dataset>(numbered(41), one_of(2, 0, 7), {.batch_size = 3}, {}, 7);
  CHECK_THROWS_WITH(more_data.restore(saved.get<cohort::loader_state>()),
                    contains_text("saved over a dataset of 40 samples and this loader's has 41"));
}

TEST_CASE("a loader resumed at another world size goes on from exactly the samples seen", "[torch][data]") {
  // 4 ranks train epoch 0 and 2 batches of epoch 1; the job is relaunched with 3 ranks.
  auto make = [&](int world, int rank) {
    return cohort::data_loader<cohort::tensor_dataset>(numbered(60), shuffled_shard(world, rank, 5), {.batch_size = 3}, {}, 5);
  };
  std::multiset<std::int64_t> epoch1;
  nlohmann::json saved;
  for (int r = 0; r < 4; ++r) {
    auto l = make(4, r);
    for (auto& b : l.epoch()) (void)b;
    for (auto& b : l.epoch()) {
      for (auto id : ids_of(b)) epoch1.insert(id);
      if (l.state().position == 2) break;
    }
    if (r == 0) saved = l.state();
    else CHECK(nlohmann::json(l.state()) == saved);  // the same state on every rank
  }
  CHECK(saved["world_size"] == 4);
  CHECK(saved.get<cohort::loader_state>().samples_seen() == 24);
  std::vector<std::vector<std::int64_t>> epoch2(3);
  for (int r = 0; r < 3; ++r) {
    auto l = make(3, r);
    l.restore(saved.get<cohort::loader_state>());
    CHECK(l.state().samples_seen() == 24);
    CHECK(l.batches_per_epoch() == 4);  // the 36 samples left, 12 per rank
    for (auto& b : l.epoch())
      for (auto id : ids_of(b)) epoch1.insert(id);
    CHECK(l.state().epoch == 2);
    CHECK(l.state().epoch_offset == 0);
    for (auto& b : l.epoch())
      for (auto id : ids_of(b)) epoch2[static_cast<std::size_t>(r)].push_back(id);
  }
  std::multiset<std::int64_t> once;
  for (std::int64_t i = 0; i < 60; ++i) once.insert(i);
  CHECK(epoch1 == once);  // every sample of the interrupted epoch exactly once
  for (int r = 0; r < 3; ++r) {  // the next epoch is an ordinary 3-rank epoch
    std::vector<std::int64_t> fresh;
    auto l = make(3, r);
    l.restore({.epoch = 2, .seed = 5, .world_size = 3, .batch_size = 3, .epoch_world_size = 3});
    for (auto& b : l.epoch())
      for (auto id : ids_of(b)) fresh.push_back(id);
    CHECK(fresh == epoch2[static_cast<std::size_t>(r)]);
  }
  auto fixed = cohort::data_loader<cohort::tensor_dataset>(numbered(60), one_of(3, 0, 5), {.batch_size = 3}, {}, 5);
  CHECK_THROWS_WITH(fixed.restore(saved.get<cohort::loader_state>()), contains_text("cannot deal its epoch again"));
}

TEST_CASE("an epoch resumed at another world size trains what the uninterrupted epoch would, partial batches dropped", "[torch][data]") {
  // 20 samples, 2 ranks of batch 4: 10 per rank, 2 full batches each, 2 samples per rank dropped.
  auto shard = [](int world, int rank) { return shuffled_shard(world, rank, 2); };
  std::multiset<std::int64_t> uninterrupted, resumed;
  nlohmann::json saved;
  for (int r = 0; r < 2; ++r) {
    cohort::data_loader<cohort::tensor_dataset> l(numbered(20), shard(2, r), {.batch_size = 4}, {}, 2);
    for (auto& b : l.epoch()) {
      for (auto id : ids_of(b)) uninterrupted.insert(id);
      if (l.state().position == 1) {
        for (auto id : ids_of(b)) resumed.insert(id);
        saved = l.state();
      }
    }
  }
  cohort::data_loader<cohort::tensor_dataset> one(numbered(20), shard(1, 0), {.batch_size = 4}, {}, 2);
  one.restore(saved.get<cohort::loader_state>());
  CHECK(one.state().epoch_end == 16);
  CHECK(one.batches_per_epoch() == 2);  // the 8 samples the 2 ranks had left, not the 4 they dropped
  for (auto& b : one.epoch())
    for (auto id : ids_of(b)) resumed.insert(id);
  CHECK(resumed == uninterrupted);
  CHECK(uninterrupted.size() == 16);
}

TEST_CASE("torch::data datasets load through prepare_data_loader", "[torch][data][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) {
             auto loader = cohort::prepare_data_loader(ctx, squares{}, {.batch_size = 2, .drop_last = false});
             std::int64_t count = 0;
             for (auto& b : loader.epoch()) {
               REQUIRE(b.inputs.sizes() == torch::IntArrayRef({b.targets.size(0), 3}));
               CHECK(torch::equal(b.inputs.select(1, 2), (b.targets * b.targets).to(torch::kFloat)));
               count += b.targets.size(0);
             }
             return count;
           }}.fit(nlohmann::json::object(), quiet("torch_data"));
  REQUIRE(r.ok());
  CHECK(r.return_values.front() == (10 + cohort_test::world_size() - 1) / cohort_test::world_size());
}

TEST_CASE("loader misuse gives a clear error on every rank", "[torch][data][mpi][bad-input]") {
  auto big = cohort::trainer{[](cohort::context& ctx) { ctx.dataset_shard("train", {.batch_size = 100}); },
                             cohort::datasets{{"train", numbered(10)}}}
                 .fit(nlohmann::json::object(), quiet("loader_big"));
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(*big.error, contains_text("batch_size 100 is larger than this rank's shard"));
  auto missing = cohort::trainer{[](cohort::context& ctx) { ctx.dataset_shard("valid"); },
                                 cohort::datasets{{"train", numbered(10)}}}
                     .fit(nlohmann::json::object(), quiet("loader_missing"));
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(*missing.error, contains_text("no dataset named 'valid': the trainer has 'train'"));
}
