#include <cohort/gradients/bucket_plan.hpp>

#include <algorithm>

#include "../catch.hpp"

using cohort::plan_buckets;
using cohort::tensor_spec;

TEST_CASE("buckets take tensors in reverse order and close once they hold the cap", "[torch][bucket][pure]") {
  std::vector<tensor_spec> t{{40, 0}, {40, 0}, {40, 0}, {40, 0}, {40, 0}, {40, 0}};
  auto plan = plan_buckets(t, {.bucket_cap_bytes = 100, .first_bucket_cap_bytes = 50});
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].tensors == std::vector<std::size_t>{5, 4});     // first bucket: 80 >= 50
  CHECK(plan[1].tensors == std::vector<std::size_t>{3, 2, 1});  // then 120 >= 100
  CHECK(plan[2].tensors == std::vector<std::size_t>{0});        // the rest, still open at the end
  CHECK(plan[0].bytes == 80);
  CHECK(plan[1].bytes == 120);
  CHECK(plan[2].bytes == 40);
  // Exactly the cap closes the bucket.
  auto exact = plan_buckets(t, {.bucket_cap_bytes = 80, .first_bucket_cap_bytes = 40});
  REQUIRE(exact.size() == 4);
  CHECK(exact[0].tensors == std::vector<std::size_t>{5});
  CHECK(exact[1].tensors == std::vector<std::size_t>{4, 3});
}

TEST_CASE("a large tensor closes the bucket it joins, so its all-reduce starts when it is ready", "[torch][bucket][pure]") {
  // The reference CNN in order (conv1 w/b, bn1 w/b, conv2 w/b, bn2 w/b, fc1 w/b, fc2 w/b), float32
  // bytes, DDP's default caps: fc1's 1.6 MB weight closes the first bucket with fc2's and fc1's
  // bias, and the convolutions, whose backward comes last, share the second.
  std::vector<tensor_spec> cnn{{1152, 0}, {128, 0}, {128, 0}, {128, 0}, {73728, 0}, {256, 0}, {256, 0},
                               {256, 0},  {1605632, 0}, {512, 0}, {5120, 0}, {40, 0}};
  auto plan = plan_buckets(cnn, {});
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].tensors == std::vector<std::size_t>{11, 10, 9, 8});
  CHECK(plan[0].bytes == 40 + 5120 + 512 + 1605632);
  CHECK(plan[1].tensors == std::vector<std::size_t>{7, 6, 5, 4, 3, 2, 1, 0});
  // A tensor larger than the cap alone: a bucket of its own.
  std::vector<tensor_spec> t{{10, 0}, {500, 0}, {10, 0}};
  auto big = plan_buckets(t, {.bucket_cap_bytes = 100, .first_bucket_cap_bytes = 5});
  REQUIRE(big.size() == 3);
  CHECK(big[0].tensors == std::vector<std::size_t>{2});
  CHECK(big[1].tensors == std::vector<std::size_t>{1});
  CHECK(big[2].tensors == std::vector<std::size_t>{0});
}

TEST_CASE("dtypes never share a bucket and every tensor is planned once", "[torch][bucket][pure]") {
  std::vector<tensor_spec> t;
  for (int i = 0; i < 50; ++i) t.push_back({static_cast<std::size_t>(8 * (i % 7 + 1)), i % 3});
  auto plan = plan_buckets(t, {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 16});
  std::vector<int> count(t.size(), 0);
  for (auto const& b : plan) {
    std::size_t bytes = 0;
    for (auto i : b.tensors) {
      ++count[i];
      CHECK(t[i].dtype == b.dtype);
      bytes += t[i].bytes;
    }
    CHECK(bytes == b.bytes);
  }
  CHECK(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  auto defaults = plan_buckets(t, {});
  CHECK(defaults.size() == 3);  // 25 MiB holds all of one dtype
}

TEST_CASE("a communication thread is used only when every local rank has a spare core", "[torch][bucket][pure]") {
  using cohort::reduce_on;
  CHECK_FALSE(cohort::use_communication_thread(reduce_on::automatic, 2, 2));
  CHECK(cohort::use_communication_thread(reduce_on::automatic, 16, 4));
  CHECK_FALSE(cohort::use_communication_thread(reduce_on::automatic, 7, 4));
  CHECK(cohort::use_communication_thread(reduce_on::communication_thread, 1, 4));
  CHECK_FALSE(cohort::use_communication_thread(reduce_on::training_thread, 64, 1));
}

TEST_CASE("an automatic reducer moves to a communication thread only on a measured slow link between nodes", "[torch][bucket][pure]") {
  using cohort::reduce_on;
  double const slow = cohort::slow_link_bytes_per_s / 2, fast = cohort::slow_link_bytes_per_s * 2;
  CHECK(cohort::thread_for_link(reduce_on::automatic, 2, slow, 2));
  CHECK(cohort::thread_for_link(reduce_on::automatic, 8, slow, 0.5));
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 2, fast, 2));
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 2, cohort::slow_link_bytes_per_s, 2));
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 2, 0, 2));  // not measured yet
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 1, slow, 2));  // one node: shared memory, whatever the rate
  CHECK_FALSE(cohort::thread_for_link(reduce_on::training_thread, 2, slow, 2));  // chosen by the user
}

TEST_CASE("the rate under which automatic moves to the thread falls with the square of the ranks per core beyond 2", "[torch][bucket][pure]") {
  using cohort::reduce_on;
  CHECK(cohort::slow_link_threshold(0.25) == cohort::slow_link_bytes_per_s);
  CHECK(cohort::slow_link_threshold(2) == cohort::slow_link_bytes_per_s);
  CHECK(cohort::slow_link_threshold(4) == cohort::slow_link_bytes_per_s / 4);
  CHECK(cohort::slow_link_threshold(8) == cohort::slow_link_bytes_per_s / 16);
  // The rates read across 2 hosts x 4 ranks of one core (docs/benchmarks.md): 200 Mbit/s moves,
  // 1 Gbit/s and an unshaped link stay; at 2 ranks a core 1 Gbit/s moves.
  CHECK(cohort::thread_for_link(reduce_on::automatic, 2, 23e6, 4));
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 2, 121e6, 4));
  CHECK_FALSE(cohort::thread_for_link(reduce_on::automatic, 2, 175e6, 4));
  CHECK(cohort::thread_for_link(reduce_on::automatic, 2, 124e6, 2));
}
