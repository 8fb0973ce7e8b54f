#include <cohort/gradients/bucket_plan.hpp>

#include <algorithm>

#include "../catch.hpp"

using cohort::plan_buckets;
using cohort::tensor_spec;

TEST_CASE("buckets take tensors in reverse order up to the cap", "[torch][bucket][pure]") {
  std::vector<tensor_spec> t{{40, 0}, {40, 0}, {40, 0}, {40, 0}, {40, 0}};
  auto plan = plan_buckets(t, {.bucket_cap_bytes = 100, .first_bucket_cap_bytes = 50});
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].tensors == std::vector<std::size_t>{4});     // first bucket: small cap
  CHECK(plan[1].tensors == std::vector<std::size_t>{3, 2});  // then up to 100 bytes
  CHECK(plan[2].tensors == std::vector<std::size_t>{1, 0});
  CHECK(plan[1].bytes == 80);
}

TEST_CASE("a tensor larger than the cap gets its own bucket", "[torch][bucket][pure]") {
  std::vector<tensor_spec> t{{10, 0}, {500, 0}, {10, 0}};
  auto plan = plan_buckets(t, {.bucket_cap_bytes = 100, .first_bucket_cap_bytes = 100});
  REQUIRE(plan.size() == 3);
  CHECK(plan[1].tensors == std::vector<std::size_t>{1});
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
