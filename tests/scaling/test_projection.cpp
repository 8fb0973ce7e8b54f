#include <cohort/scaling/projection.hpp>
#include <cohort/gradients/bucket_plan.hpp>

#include <array>
#include <numeric>

#include "../catch.hpp"

using namespace cohort::scaling;

namespace {

// One node of `gpus` GPUs joined by a link with no latency: only the bandwidth term is left.
cluster bandwidth_only(double gbytes_per_s) {
  return {.gpus_per_node = 8,
          .intra_node = {.alpha_us = 0, .tree_alpha_us = 0, .bus_bandwidth_gbytes_per_s = gbytes_per_s},
          .inter_node = {.alpha_us = 0, .tree_alpha_us = 0, .bus_bandwidth_gbytes_per_s = gbytes_per_s / 8},
          .call_latency_us = 0};
}

// A cluster with round numbers, so that the expected costs below are worked out by hand (in the
// comments), not with the library's formulas: a regression in a formula or a default then fails.
cluster round_numbers() {
  return {.gpus_per_node = 8,
          .intra_node = {.alpha_us = 2, .tree_alpha_us = 1, .bus_bandwidth_gbytes_per_s = 400},
          .inter_node = {.alpha_us = 5, .tree_alpha_us = 10, .bus_bandwidth_gbytes_per_s = 40},
          .call_latency_us = 20,
          .tree_bandwidth_fraction = 0.5};
}

double sum(std::span<std::size_t const> v) { return static_cast<double>(std::accumulate(v.begin(), v.end(), std::size_t{0})); }

}  // namespace

TEST_CASE("a 1 GB ring all-reduce on 8 GPUs costs 2*7/8 of a GB at the bus bandwidth plus 14 steps", "[scaling][projection]") {
  interconnect nvlink{.alpha_us = 2.0, .tree_alpha_us = 1.0, .bus_bandwidth_gbytes_per_s = 370};
  double seconds = 2.0 * 7 / 8 * 1e9 / 370e9;
  CHECK(flat_ring_allreduce_us(1'000'000'000, 8, nvlink) == Approx(seconds * 1e6 + 14 * 2.0));
  CHECK(seconds * 1e6 == Approx(4729.73).epsilon(1e-5));
  // In a cluster: the call latency, all 14 steps over NVLink, 2*7/8 GB at 400 GB/s:
  // 20 + 14 * 2 + 4375 = 4423 us.
  cluster const c = round_numbers();
  CHECK(ring_allreduce_us(1'000'000'000, 8, c) == Approx(4423.0));
  // The tree: 20 + 2 * 7 hops * 1 us + 2 GB at 0.5 * 400 GB/s (10,000 us) = 10,034 us; the ring wins.
  CHECK(tree_allreduce_us(1'000'000'000, 8, c) == Approx(10034.0));
  CHECK(allreduce_us(1'000'000'000, 8, c) == Approx(4423.0));
  STATIC_REQUIRE(flat_ring_allreduce_us(1000, 2, interconnect{.alpha_us = 1, .tree_alpha_us = 0, .bus_bandwidth_gbytes_per_s = 1}) == 1000 / 1e3 + 2);
}

TEST_CASE("one GPU communicates nothing", "[scaling][projection]") {
  cluster c;
  CHECK(flat_ring_allreduce_us(1 << 30, 1, c.intra_node) == 0);
  CHECK(ring_allreduce_us(1 << 30, 1, c) == 0);
  CHECK(tree_allreduce_us(1 << 30, 1, c) == 0);
  CHECK(allreduce_us(1 << 30, 1, c) == 0);
  auto buckets = uniform_buckets(200 << 20);
  auto p = project_step(buckets, {.step_us = 1000, .backward_fraction = 0.6, .optimizer_fraction = 0.1,
                                  .per_bucket_overhead_us = 50},
                        c, 1);
  CHECK(p.communication_us == 0);
  CHECK(p.exposed_communication_us == 0);
  CHECK(p.step_us == Approx(1000));
  CHECK(p.efficiency == Approx(1));
}

TEST_CASE("more GPUs never make an all-reduce faster, and per byte the ring only pays 2(n-1)/n", "[scaling][projection]") {
  interconnect l{.alpha_us = 1.5, .tree_alpha_us = 1, .bus_bandwidth_gbytes_per_s = 370};
  std::size_t bytes = 25 << 20;
  for (int n = 2; n < 1024; n += 7) {
    CHECK(flat_ring_allreduce_us(bytes, n + 1, l) >= flat_ring_allreduce_us(bytes, n, l));
    // What is left after the latency, divided by 2(n-1)/n, is the same for every n: B / busbw.
    double bandwidth_us = flat_ring_allreduce_us(bytes, n, l) - 2 * (n - 1) * l.alpha_us;
    CHECK(bandwidth_us / (2.0 * (n - 1) / n) == Approx(bytes / 370e3));
  }
  // In a cluster, over whole nodes (a part-filled node has fewer network rails: see below).
  cluster c;
  std::vector<int> counts{1, 2, 3, 4, 5, 6, 7, 8};
  for (int n = 16; n <= 1024; n += 8) counts.push_back(n);
  for (std::size_t b : {std::size_t{1} << 10, std::size_t{1} << 20, std::size_t{25} << 20, std::size_t{1} << 30})
    for (std::size_t i = 1; i < counts.size(); ++i) {
      CHECK(ring_allreduce_us(b, counts[i], c) >= ring_allreduce_us(b, counts[i - 1], c));
      CHECK(tree_allreduce_us(b, counts[i], c) >= tree_allreduce_us(b, counts[i - 1], c));
      CHECK(allreduce_us(b, counts[i], c) >= allreduce_us(b, counts[i - 1], c));
    }
}

TEST_CASE("across nodes the ring runs at its slowest link and the tree wins small messages at scale", "[scaling][projection]") {
  cluster c;
  CHECK(nodes_for(8, c) == 1);
  CHECK(nodes_for(9, c) == 2);
  CHECK(nodes_for(1024, c) == 128);
  CHECK(ring_bus_bandwidth_gbytes_per_s(8, c) == 370);
  CHECK(ring_bus_bandwidth_gbytes_per_s(16, c) == Approx(8 * 45));  // eight 400 Gb/s rails at 90%
  // A part-filled node has only its own GPUs' rails: 9 GPUs are slower than 16.
  CHECK(ring_bus_bandwidth_gbytes_per_s(12, c) == Approx(4 * 45));
  CHECK(ring_allreduce_us(1 << 30, 9, c) > ring_allreduce_us(1 << 30, 16, c));
  CHECK(ring_bus_bandwidth_gbytes_per_s(16, cluster{.inter_node = {.bus_bandwidth_gbytes_per_s = 100}}) == 370);
  // NCCL's latency split: 2 * nodes of the 2(n-1) steps cross the network. With round numbers,
  // 64 MiB on 1024 GPUs (128 nodes): the ring runs at min(400, 8 rails * 40) = 320 GB/s, so
  // 20 + (2046 - 256) * 2 + 256 * 5 + 2 * 1023/1024 * 67,108,864 / 320e3 (419.0208) = 5299.0208 us;
  // the tree climbs 7 hops in a node and 7 across nodes, both ways, at 0.5 * 320 GB/s:
  // 20 + 2 * (7 * 1 + 7 * 10) + 2 * 67,108,864 / 160e3 (838.8608) = 1012.8608 us, and wins.
  std::size_t bytes = 64 << 20;
  cluster const r = round_numbers();
  CHECK(ring_bus_bandwidth_gbytes_per_s(1024, r) == Approx(320));
  CHECK(ring_allreduce_us(bytes, 1024, r) == Approx(5299.0208));
  CHECK(tree_allreduce_us(bytes, 1024, r) == Approx(1012.8608));
  CHECK(allreduce_us(bytes, 1024, r) == Approx(1012.8608));
  CHECK(ceil_log2(1) == 0);
  CHECK(ceil_log2(128) == 7);
  CHECK(ceil_log2(129) == 8);
  // 1024 GPUs: the ring's 2046 steps cost milliseconds, so a 1 MiB bucket goes by tree.
  CHECK(allreduce_us(1 << 20, 1024, c) == tree_allreduce_us(1 << 20, 1024, c));
  CHECK(allreduce_us(1 << 20, 1024, c) < 200);
  // One node: the ring's 14 short steps beat the tree's bandwidth penalty for a large bucket.
  CHECK(allreduce_us(bytes, 8, c) == ring_allreduce_us(bytes, 8, c));
}

TEST_CASE("uniform buckets follow the first-bucket and bucket caps", "[scaling][projection]") {
  cohort::model_options o;  // 1 MiB first, 25 MiB after
  auto b = uniform_buckets((60 << 20) + 5, o);
  REQUIRE(b.size() == 4);
  CHECK(b[0] == (1 << 20));
  CHECK(b[1] == (25 << 20));
  CHECK(b[2] == (25 << 20));
  CHECK(b[3] == (9 << 20) + 5);
  CHECK(uniform_buckets(1000, o) == std::vector<std::size_t>{1000});
  CHECK(uniform_buckets(0, o).empty());
  CHECK(uniform_buckets(10, {.bucket_cap_bytes = 4, .first_bucket_cap_bytes = 2}) == std::vector<std::size_t>{2, 4, 4});
}

TEST_CASE("an all-reduce chain longer than backward is exposed, computed by hand", "[scaling][projection]") {
  // Two GPUs, 1 GB/s, no latency: each 1 MB bucket takes 1000 us. Forward 300, backward 600,
  // optimizer 100. Bucket 0 is ready at 600 and done at 1600; bucket 1 is ready at 900 (end of
  // backward), starts at 1600, done at 2600; the optimizer ends the step at 2700.
  auto c = bandwidth_only(1.0);
  std::array<std::size_t, 2> buckets{1'000'000, 1'000'000};
  step_profile profile{.step_us = 1000, .backward_fraction = 0.6, .optimizer_fraction = 0.1};
  auto p = project_step(buckets, profile, c, 2);
  CHECK(p.gpus == 2);
  CHECK(p.nodes == 1);
  CHECK(p.buckets == 2);
  CHECK(p.communication_us == Approx(2000));
  CHECK(p.step_us == Approx(2700));
  CHECK(p.exposed_communication_us == Approx(1700));
  CHECK(p.efficiency == Approx(1000.0 / 2700));
  // A per-bucket overhead lengthens the chain by one overhead per bucket.
  profile.per_bucket_overhead_us = 10;
  CHECK(project_step(buckets, profile, c, 2).step_us == Approx(2720));
  STATIC_REQUIRE(project_step(std::span<std::size_t const>{}, step_profile{.step_us = 5}, cluster{}, 64).step_us == 5);
}

TEST_CASE("tiny all-reduces hide behind backward except the last bucket's", "[scaling][projection]") {
  cluster c;
  std::array<std::size_t, 4> buckets{4096, 4096, 4096, 4096};
  step_profile profile{.step_us = 100'000, .backward_fraction = 0.6, .optimizer_fraction = 0.1};
  // One 4 KiB all-reduce of the default cluster, by hand: NCCL's tree wins at every count. Tree:
  // 14 us call + 2 x ((GPUs per node - 1) x 1.25 + ceil(log2 nodes) x 8.5) + 2 x 4096 B at 0.92 x
  // the ring's bus bandwidth (370 GB/s in a node; from 2 nodes, min(370, 8 x 45) = 360).
  //   2 GPUs:    14 + 2 x 1.25                = 16.5  + 8192 / 340,400 = 16.524066
  //   8 GPUs:    14 + 2 x 8.75                = 31.5  + 8192 / 340,400 = 31.524066
  //   64 GPUs:   14 + 2 x (8.75 + 3 x 8.5)    = 82.5  + 8192 / 331,200 = 82.524734
  //   1024 GPUs: 14 + 2 x (8.75 + 7 x 8.5)    = 150.5 + 8192 / 331,200 = 150.524734
  // (the ring: 2 GPUs 14 + 2 x 1.9 + 4096 / 370,000 = 17.811, already slower.)
  std::array<std::pair<int, double>, 4> const one_allreduce_us{
      {{2, 16.524066}, {8, 31.524066}, {64, 82.524734}, {1024, 150.524734}}};
  for (auto [n, us] : one_allreduce_us) {
    auto p = project_step(buckets, profile, c, n);
    // The last bucket is ready only as backward ends: its all-reduce is all that shows.
    CHECK(p.exposed_communication_us == Approx(us).epsilon(1e-6));
    CHECK(p.exposed_communication_us < 0.01 * p.step_us);
    CHECK(p.communication_us == Approx(4 * us).epsilon(1e-6));
  }
}

TEST_CASE("when communication dominates, the step is the first bucket's ready time plus the chain", "[scaling][projection]") {
  cluster c;
  cohort::model_options o;
  auto buckets = uniform_buckets(std::size_t{400} << 20, o);  // 400 MiB of gradients
  step_profile profile{.step_us = 200, .backward_fraction = 0.5, .optimizer_fraction = 0.25};
  auto p = project_step(buckets, profile, c, 256);
  // Every all-reduce outlasts the whole backward, so the stream never idles after the first bucket.
  double first_ready_us = 50 + 100 * static_cast<double>(buckets[0]) / sum(buckets);
  CHECK(p.step_us == Approx(first_ready_us + p.communication_us + 50));
  CHECK(p.exposed_communication_us == Approx(p.communication_us - (150 - first_ready_us)));
  CHECK(p.exposed_communication_us > 0.9 * p.communication_us);
  CHECK(p.efficiency < 0.05);
}

TEST_CASE("efficiency is at most 1 and falls as GPUs are added", "[scaling][projection]") {
  cluster c;
  // The 54.6M-parameter MLP of the issue (fp32), planned as prepare_model plans it.
  std::vector<cohort::tensor_spec> tensors;
  auto linear = [&](std::size_t in, std::size_t out) {
    tensors.push_back({in * out * 4, 0});
    tensors.push_back({out * 4, 0});
  };
  linear(1024, 4096);
  for (int i = 0; i < 3; ++i) linear(4096, 4096);
  linear(4096, 10);
  std::vector<std::size_t> buckets;
  for (auto const& b : cohort::plan_buckets(tensors, {})) buckets.push_back(b.bytes);
  CHECK(sum(buckets) == 54'583'306.0 * 4);
  std::array<int, 9> counts{1, 8, 16, 32, 64, 128, 256, 512, 1024};
  for (double step_us : {100.0, 1000.0, 10'000.0}) {
    auto rows = project_scaling(buckets, {.step_us = step_us, .backward_fraction = 0.55, .optimizer_fraction = 0.2,
                                          .per_bucket_overhead_us = 5},
                                c, counts);
    REQUIRE(rows.size() == counts.size());
    CHECK(rows[0].efficiency == Approx(1));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CHECK(rows[i].gpus == counts[i]);
      CHECK(rows[i].efficiency <= 1.0);
      CHECK(rows[i].efficiency > 0.0);
      CHECK(rows[i].step_us == Approx(rows[i].compute_us + rows[i].exposed_communication_us));
      CHECK(rows[i].exposed_communication_us <= rows[i].communication_us + 1e-9);
      if (i > 0) CHECK(rows[i].efficiency <= rows[i - 1].efficiency);
    }
  }
}

TEST_CASE("a cluster prints its link parameters", "[scaling][projection]") {
  auto s = to_string(cluster{});
  CHECK_THAT(s, contains_text("8 GPUs/node"));
  CHECK_THAT(s, contains_text("NVLink busbw 370 GB/s"));
  CHECK_THAT(s, contains_text("network busbw 45 GB/s per GPU"));
}
