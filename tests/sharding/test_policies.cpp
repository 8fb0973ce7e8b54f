#include <cohort/concepts.hpp>
#include <cohort/data/loader_options.hpp>
#include <cohort/sharding/policies.hpp>
#include <cohort/sharding/redeal.hpp>

#include <algorithm>
#include <map>

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

TEST_CASE("the order table of docs/data.md: 10 samples over 3 ranks, the same on every platform", "[sharding][pure]") {
  // Catches: a shuffle whose order depends on the standard library (std::shuffle,
  // std::uniform_int_distribution), a changed dealing, or docs that no longer say what the
  // policies do. The rows are copied from docs/data.md, not computed.
  using v = std::vector<std::size_t>;
  auto deal = [](auto const& policy, std::size_t epoch) {  // what ranks 0, 1, 2 get
    return std::vector<v>{policy.indices(10, 3, 0, epoch), policy.indices(10, 3, 1, epoch), policy.indices(10, 3, 2, epoch)};
  };
  auto const drop = remainder::drop;
  std::vector<std::pair<std::vector<v>, std::vector<v>>> const rows{
      {deal(contiguous{}, 0), {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 0, 1}}},
      {deal(contiguous{.on_remainder = drop}, 0), {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}},
      {deal(interleaved{}, 0), {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}},
      {deal(interleaved{.on_remainder = drop}, 0), {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}},
      {deal(shuffled{.seed = 42}, 0), {{2, 5, 8, 3}, {6, 0, 7, 2}, {9, 1, 4, 6}}},
      {deal(shuffled{.seed = 42}, 1), {{5, 2, 8, 1}, {3, 7, 0, 5}, {9, 4, 6, 3}}},
      {deal(shuffled{.seed = 42, .on_remainder = drop}, 0), {{2, 5, 8}, {6, 0, 7}, {9, 1, 4}}},
  };
  for (auto const& [got, want] : rows) CHECK(got == want);
}

#include <cohort/data/batch_size.hpp>

TEST_CASE("global batch size is per-worker batch size times the world size", "[sharding][pure]") {
  CHECK(cohort::global_batch_size(64, 3) == 192);
  CHECK(cohort::per_worker_batch_size(192, 3) == 64);
  CHECK_THROWS_WITH(cohort::per_worker_batch_size(100, 3), contains_text("does not divide over 3 ranks"));
}

TEST_CASE("in-memory batches are made on the training thread when its intra-op threads take the rank's cores",
          "[sharding][pure]") {
  using cohort::loader_threads;
  cohort::loader_options const prefetch{.prefetch_batches = 2};
  // One rank of two cores, two intra-op threads, nothing spare: no thread for a tensor dataset...
  CHECK(loader_threads(prefetch, true, 2, 2, false) == 0);
  CHECK(loader_threads(prefetch, true, 4, 2, false) == 0);  // more threads than cores
  // ...but a thread for batches read or decoded, where it overlaps real work.
  CHECK(loader_threads(prefetch, false, 2, 2, false) == 1);
  // A core left over, a spare core for cohort's threads, or one intra-op thread: the thread stays.
  CHECK(loader_threads(prefetch, true, 2, 4, false) == 1);
  CHECK(loader_threads(prefetch, true, 2, 2, true) == 1);
  CHECK(loader_threads(prefetch, true, 1, 1, false) == 1);
  // Workers asked for are always given; no prefetching is no thread.
  CHECK(loader_threads({.prefetch_batches = 2, .num_workers = 3}, true, 2, 2, false) == 3);
  CHECK(loader_threads({.prefetch_batches = 0}, false, 1, 8, true) == 0);
}

namespace {

/// What ranks of `world` trained on in the first `batches` batches of `batch` samples of `epoch`
/// (each rank's own dealing, as the loader hands it out), and what is left to them.
template <class P>
std::vector<std::size_t> first_batches(P const& p, std::size_t size, int world, std::int64_t epoch, std::size_t batches,
                                       std::size_t batch) {
  std::vector<std::size_t> out;
  for (int r = 0; r < world; ++r) {
    auto idx = p.indices(size, world, r, epoch);
    out.insert(out.end(), idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(std::min(idx.size(), batches * batch)));
  }
  return out;
}

std::map<std::size_t, int> counts(std::vector<std::size_t> const& v) {
  std::map<std::size_t, int> c;
  for (auto i : v) ++c[i];
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("an epoch dealt again to another world size goes on from exactly the samples seen", "[sharding][pure]",
                   shuffled, contiguous, interleaved) {
  TestType const policy{};
  indices_fn const fn = [policy](std::size_t n, int w, int r, std::int64_t e) { return policy.indices(n, w, r, e); };
  std::size_t const size = 48;
  // 4 ranks, batches of 3: 2 batches trained (24 samples), then 3 ranks go on.
  auto seen = first_batches(policy, size, 4, 5, 2, 3);
  auto const sequence = epoch_sequence(fn, size, 4, 5);
  CHECK(counts(std::vector<std::size_t>(sequence.begin(), sequence.begin() + 24)) == counts(seen));  // a prefix
  std::vector<std::size_t> rest_all;
  for (int r = 0; r < 3; ++r) {
    auto mine = redeal(fn, size, 5, 4, 24, 0, 3, r);
    CHECK(mine.size() == 8);  // equal counts
    rest_all.insert(rest_all.end(), mine.begin(), mine.end());
  }
  auto whole = seen;
  whole.insert(whole.end(), rest_all.begin(), rest_all.end());
  CHECK(counts(whole) == counts(first_batches(policy, size, 4, 5, 16, 3)));  // the uninterrupted epoch, once each

  // Then 3 ranks train one batch of 2 (6 more samples, still a prefix) and 2 ranks go on.
  for (int r = 0; r < 3; ++r) {
    auto mine = redeal(fn, size, 5, 4, 24, 0, 3, r);
    seen.insert(seen.end(), mine.begin(), mine.begin() + 2);
  }
  CHECK(counts(std::vector<std::size_t>(sequence.begin(), sequence.begin() + 30)) == counts(seen));
  whole = seen;
  for (int r = 0; r < 2; ++r) {
    auto mine = redeal(fn, size, 5, 4, 30, 0, 2, r);
    CHECK(mine.size() == 9);
    whole.insert(whole.end(), mine.begin(), mine.end());
  }
  CHECK(counts(whole) == counts(first_batches(policy, size, 4, 5, 16, 3)));
}

TEST_CASE("a rest that does not divide evenly repeats its first samples, as padding does", "[sharding][pure]") {
  shuffled const policy{.seed = 3};
  indices_fn const fn = [policy](std::size_t n, int w, int r, std::int64_t e) { return policy.indices(n, w, r, e); };
  auto const sequence = epoch_sequence(fn, 50, 4, 0);  // 13 per rank, 2 samples padded
  REQUIRE(sequence.size() == 52);
  std::vector<std::size_t> rest;
  for (int r = 0; r < 3; ++r) {
    auto mine = redeal(fn, 50, 0, 4, 12, 0, 3, r);  // 40 left over 3 ranks: 14 each, 2 repeated
    CHECK(mine.size() == 14);
    rest.insert(rest.end(), mine.begin(), mine.end());
  }
  auto c = counts(rest);
  auto expected = counts(std::vector<std::size_t>(sequence.begin() + 12, sequence.end()));
  ++expected[sequence[12]];
  ++expected[sequence[13]];
  CHECK(c == expected);
  std::vector<std::size_t> up_to_end;
  for (int r = 0; r < 3; ++r) {
    auto mine = redeal(fn, 50, 0, 4, 12, 48, 3, r);  // the epoch trains 48 (the rest dropped): 12 each
    CHECK(mine.size() == 12);
    up_to_end.insert(up_to_end.end(), mine.begin(), mine.end());
  }
  CHECK(counts(up_to_end) == counts(std::vector<std::size_t>(sequence.begin() + 12, sequence.begin() + 48)));
  CHECK(redeal(fn, 50, 0, 4, 52, 0, 3, 0).empty());  // nothing left: an empty rest on every rank
  CHECK(redeal(fn, 50, 0, 4, 48, 48, 3, 2).empty());
  CHECK(redeal(fn, 50, 0, 4, 99, 0, 2, 1).empty());
}
