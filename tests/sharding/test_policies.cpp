#include <cohort/concepts.hpp>
#include <cohort/sharding/policies.hpp>

#include <set>

#include "../catch.hpp"

using namespace cohort::sharding;

template <class P>
void check_invariants(P const& p, std::size_t size, int world, std::int64_t epoch) {
  std::vector<std::size_t> seen;
  std::size_t per = p.indices(size, world, 0, epoch).size();
  for (int r = 0; r < world; ++r) {
    auto idx = p.indices(size, world, r, epoch);
    CHECK(idx.size() == per);  // equal counts on every rank
    for (auto i : idx) CHECK(i < size);
    seen.insert(seen.end(), idx.begin(), idx.end());
  }
  std::set<std::size_t> unique(seen.begin(), seen.end());
  if (p.on_remainder == remainder::pad) CHECK(unique.size() == size);            // every sample
  else CHECK(unique.size() == seen.size());                                      // at most once
}

TEST_CASE("shards have equal counts, cover with pad and are disjoint with drop", "[sharding][pure]") {
  for (int world = 1; world <= 8; ++world)
    for (std::size_t size = 0; size <= 3 * static_cast<std::size_t>(world) + 1; ++size)
      for (auto rem : {remainder::pad, remainder::drop}) {
        check_invariants(contiguous{.on_remainder = rem}, size, world, 0);
        check_invariants(interleaved{.on_remainder = rem}, size, world, 0);
        check_invariants(shuffled{.seed = 7, .on_remainder = rem}, size, world, 3);
      }
}

TEST_CASE("shuffled shards are deterministic and change from epoch to epoch", "[sharding][pure]") {
  shuffled p{.seed = 42};
  CHECK(p.indices(100, 3, 1, 0) == p.indices(100, 3, 1, 0));
  CHECK(p.indices(100, 3, 1, 0) != p.indices(100, 3, 1, 1));
  CHECK(p.indices(100, 3, 1, 0) != shuffled{.seed = 43}.indices(100, 3, 1, 0));
  CHECK(contiguous{}.indices(10, 3, 1, 0) == std::vector<std::size_t>{4, 5, 6, 7});
  CHECK(interleaved{}.indices(10, 3, 1, 0) == std::vector<std::size_t>{1, 4, 7, 0});
  CHECK(interleaved{.on_remainder = remainder::drop}.indices(10, 3, 2, 0) == std::vector<std::size_t>{2, 5, 8});
}

#include <cohort/sharding/batch_size.hpp>

TEST_CASE("global batch size is per-worker batch size times the world size", "[sharding][pure]") {
  CHECK(cohort::global_batch_size(64, 3) == 192);
  CHECK(cohort::per_worker_batch_size(192, 3) == 64);
  CHECK_THROWS_WITH(cohort::per_worker_batch_size(100, 3), contains_text("does not divide over 3 ranks"));
}
