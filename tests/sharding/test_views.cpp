#include <cohort/sharding/views.hpp>

#include <range/v3/algorithm/equal.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/take.hpp>

#include <string>
#include <vector>

#include "../catch.hpp"

using namespace cohort;

TEST_CASE("shard views yield the policy's elements lazily and batch them", "[sharding][views][pure]") {
  std::vector<std::string> data;
  for (int i = 0; i < 11; ++i) data.push_back(std::to_string(i));
  auto mine = data | views::shard(3, 1, sharding::interleaved{}, 0);
  CHECK(ranges::size(mine) == 4);
  CHECK((mine | ranges::to<std::vector>()) == std::vector<std::string>{"1", "4", "7", "10"});
  auto batches = mine | views::batch(3) | ranges::to<std::vector<std::vector<std::string>>>();
  REQUIRE(batches.size() == 2);
  CHECK(batches[1] == std::vector<std::string>{"10"});
  data[4] = "changed";  // a view, not a copy
  CHECK(mine[1] == "changed");
}

TEST_CASE("shard views compose with range-v3 adaptors", "[sharding][views][pure]") {
  std::vector<int> data(100);
  for (int i = 0; i < 100; ++i) data[static_cast<std::size_t>(i)] = i;
  auto policy = sharding::shuffled{.seed = 5};
  auto evens = data | views::shard(4, 2, policy, 3) | ranges::views::filter([](int x) { return x % 2 == 0; }) |
               ranges::views::take(5) | ranges::to<std::vector>();
  auto expected = policy.indices(100, 4, 2, 3);
  std::vector<int> manual;
  for (auto i : expected)
    if (i % 2 == 0 && manual.size() < 5) manual.push_back(static_cast<int>(i));
  CHECK(evens == manual);
}
