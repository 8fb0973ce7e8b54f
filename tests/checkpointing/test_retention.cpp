#include <cohort/checkpointing/policies.hpp>
#include <cohort/concepts.hpp>

#include "../catch.hpp"

using namespace cohort::checkpointing;

namespace {
std::vector<record> history(std::vector<double> losses) {
  std::vector<record> out;
  for (std::size_t i = 0; i < losses.size(); ++i) out.push_back({i + 1, {{"loss", losses[i]}}});
  return out;
}
}  // namespace

TEST_CASE("retention keeps all, the last k, or the best k plus the latest", "[checkpointing][pure]") {
  auto h = history({0.9, 0.5, 0.7, 0.3, 0.8});
  CHECK(keep_all{}.retain(h) == std::vector<std::size_t>{0, 1, 2, 3, 4});
  CHECK(keep_last{.num_to_keep = 2}.retain(h) == std::vector<std::size_t>{3, 4});
  CHECK(keep_last{.num_to_keep = 9}.retain(h).size() == 5);
  CHECK(keep_best{.num_to_keep = 2, .metric = "loss", .order = cohort::min}.retain(h) ==
        std::vector<std::size_t>{1, 3, 4});
  CHECK(keep_best{.num_to_keep = 2, .metric = "loss", .order = cohort::max}.retain(h) ==
        std::vector<std::size_t>{0, 4});
  CHECK(keep_best{.num_to_keep = 1, .metric = "loss"}.retain(std::span<record const>{}).empty());
}

TEST_CASE("checkpoints without the metric rank last", "[checkpointing][pure]") {
  std::vector<record> h{{1, {{"acc", 1.0}}}, {2, {{"loss", 0.4}}}, {3, {{"loss", 0.6}}}};
  CHECK(keep_best{.num_to_keep = 1, .metric = "loss"}.retain(h) == std::vector<std::size_t>{1, 2});
  STATIC_REQUIRE(cohort::checkpointing_policy<keep_best>);
}
