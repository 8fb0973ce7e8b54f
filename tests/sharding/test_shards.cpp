#include <cohort/sharding/redeal.hpp>
#include <cohort/sharding/shards.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "../catch.hpp"

using cohort::sharding::remainder;
using cohort::sharding::shards;

namespace {

// Shard layouts: fewer shards than ranks, more, uneven, empty shards among them.
std::vector<std::vector<std::size_t>> layouts() {
  return {{}, {1}, {5}, {7, 3}, {4, 4, 4, 4}, {10, 0, 3, 8, 1}, {2, 9, 5, 5, 6, 1, 3, 7, 4, 2, 8}, {100, 1, 50}};
}

std::size_t total(std::vector<std::size_t> const& counts) { return std::accumulate(counts.begin(), counts.end(), std::size_t{0}); }

}  // namespace

TEST_CASE("shard dealing gives every rank the same count, covers with pad and is disjoint with drop", "[sharding][pure]") {
  for (auto const& counts : layouts())
    for (int world = 1; world <= 8; ++world)
      for (auto rem : {remainder::pad, remainder::drop})
        for (std::size_t buffer : {0, 1, 5, 1000}) {
          shards p{.seed = 3, .shuffle_buffer_samples = buffer, .on_remainder = rem};
          std::vector<std::size_t> all;
          auto const per = p.indices(counts, world, 0, 2).size();
          for (int r = 0; r < world; ++r) {
            auto idx = p.indices(counts, world, r, 2);
            INFO("shards " << counts.size() << ", world " << world << ", rank " << r << ", buffer " << buffer);
            CHECK(idx.size() == per);  // the same batch count on every rank
            // The shuffle buffer reorders a rank's stream, never changes what it holds.
            auto stream = p.stream(counts, world, r, 2);
            CHECK(std::is_permutation(idx.begin(), idx.end(), stream.begin(), stream.end()));
            for (auto i : idx) CHECK(i < total(counts));
            all.insert(all.end(), idx.begin(), idx.end());
          }
          std::set<std::size_t> unique(all.begin(), all.end());
          if (rem == remainder::pad) {
            CHECK(unique.size() == total(counts));  // every sample of the epoch
            CHECK(per == (total(counts) + world - 1) / world);
          } else {
            CHECK(unique.size() == all.size());  // none twice
            CHECK(per == total(counts) / world);
          }
        }
}

TEST_CASE("a rank reads whole shards front to back, split only at its block's ends", "[sharding][pure]") {
  std::vector<std::size_t> counts(12, 10);  // 12 shards of 10, samples 10 s .. 10 s + 9
  shards p{.seed = 1};
  for (int world : {1, 2, 3, 4, 5, 7}) {
    std::size_t shards_read = 0;
    for (int r = 0; r < world; ++r) {
      auto stream = p.stream(counts, world, r, 0);
      std::set<std::size_t> files;
      for (std::size_t k = 0; k < stream.size(); ++k) {
        files.insert(stream[k] / 10);
        if (k > 0 && stream[k] / 10 == stream[k - 1] / 10) CHECK(stream[k] == stream[k - 1] + 1);  // in file order
      }
      // A block of ceil(120 / world) samples spans at most that many shards plus the two it is cut in.
      CHECK(files.size() <= (stream.size() + 9) / 10 + 1);
      shards_read += files.size();
    }
    CHECK(shards_read <= 12 + static_cast<std::size_t>(world));  // a shard is split only between neighbours (and the wrap)
  }
  // Fewer shards than ranks: one shard split among 4 ranks.
  for (int r = 0; r < 4; ++r) CHECK(p.stream({8}, 4, r, 0) == std::vector<std::size_t>{2 * std::size_t(r), 2 * std::size_t(r) + 1});
}

TEST_CASE("shard order and shuffle buffer are drawn from seed and epoch", "[sharding][pure]") {
  std::vector<std::size_t> counts{6, 6, 6, 6, 6, 6, 6, 6};
  shards p{.seed = 9, .shuffle_buffer_samples = 16};
  CHECK(p.indices(counts, 3, 1, 4) == p.indices(counts, 3, 1, 4));           // deterministic
  CHECK(p.indices(counts, 3, 1, 4) != p.indices(counts, 3, 1, 5));           // a new order every epoch
  CHECK(p.shard_order(8, 4) != p.shard_order(8, 5));
  shards other = p;
  other.seed = 10;
  CHECK(p.indices(counts, 3, 1, 4) != other.indices(counts, 3, 1, 4));
  shards in_order{.shuffle_shards = false};
  CHECK(in_order.stream(counts, 1, 0, 3) == cohort::sharding::detail::identity(48));
  // The buffer mixes samples beyond a shard: the first 6 handed out are not one shard's.
  auto idx = p.indices(counts, 1, 0, 0);
  std::set<std::size_t> first_files;
  for (std::size_t k = 0; k < 6; ++k) first_files.insert(idx[k] / 6);
  CHECK(first_files.size() > 1);
  // ... but never reaches further ahead than the buffer: sample k of the stream is handed out
  // at position >= k - buffer.
  auto stream = p.stream(counts, 1, 0, 0);
  for (std::size_t k = 0; k < idx.size(); ++k) {
    auto at = static_cast<std::size_t>(std::find(stream.begin(), stream.end(), idx[k]) - stream.begin());
    CHECK(at <= k + 16);
  }
}

TEST_CASE("an epoch of shards dealt again at another world size loses and repeats nothing", "[sharding][pure]") {
  std::vector<std::size_t> counts{7, 3, 9, 5, 6};  // 30 samples
  shards p{.seed = 5, .shuffle_buffer_samples = 4, .on_remainder = remainder::drop};
  cohort::sharding::indices_fn fn = [&](std::size_t, int w, int r, std::int64_t e) { return p.indices(counts, w, r, e); };
  // 3 ranks of batch 2 trained 2 batches (12 samples), then 2 ranks deal the rest of the epoch.
  auto sequence = cohort::sharding::epoch_sequence(fn, 30, 3, 1);
  std::multiset<std::size_t> seen(sequence.begin(), sequence.begin() + 12);
  for (int r = 0; r < 2; ++r) {
    auto rest = cohort::sharding::redeal(fn, 30, 1, 3, 12, 0, 2, r);
    seen.insert(rest.begin(), rest.end());
  }
  std::multiset<std::size_t> whole(sequence.begin(), sequence.end());
  CHECK(seen == whole);  // the 30 samples of the epoch, each once
}
