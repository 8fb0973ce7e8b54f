// The tuner inside the MPI job, at every rank count of the core tests: trials split across groups
// of ranks_per_trial, schedulers and stoppers acting on the results, the experiment's files.
#include <cohort/tuning/tuner.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

using cohort_test::world_rank;
using cohort_test::world_size;

std::size_t lines_of(std::filesystem::path const& p) {
  std::ifstream in(p);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

/// A trial: `iterations` reports of score = -(x - 2)^2 - (y - 1)^2 (best at x = 2, y = 1), each
/// with the world rank that ran it and the wall-clock start, so the test can see the groups.
struct quadratic {
  int iterations = 3;
  int sleep_ms = 5;
  void operator()(cohort::context& ctx, nlohmann::json const& config) const {
    double const x = config.at("x").get<double>(), y = config.at("y").get<double>();
    auto const start = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (int i = 1; i <= iterations; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      ctx.report({{"score", -(x - 2) * (x - 2) - (y - 1) * (y - 1) + 0.01 * i},
                  {"rank", world_rank()},
                  {"group_size", ctx.world_size()},
                  {"start", start}});
    }
  }
};

}  // namespace

TEST_CASE("a grid search runs every trial once, spread over the groups", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_grid");
  cohort::tuner tuner{quadratic{}, cohort::tune_config{.metric = "score", .mode = cohort::max, .num_samples = 2, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({1.0, 2.0, 3.0})}, {"y", cohort::grid_search({0.0, 1.0, 2.0})}},
                        {.name = "grid", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 18);  // 3 x 3 grid, num_samples 2
  std::multiset<std::pair<double, double>> combos;
  std::set<int> leaders;
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    CHECK(t.metrics_history.size() == 3);
    CHECK(t.metrics.at("group_size") == 1);
    combos.insert({t.config.at("x").get<double>(), t.config.at("y").get<double>()});
    leaders.insert(t.metrics.at("rank").get<int>());
  }
  for (double x : {1.0, 2.0, 3.0})
    for (double y : {0.0, 1.0, 2.0}) CHECK(combos.count({x, y}) == 2);
  CHECK(leaders.size() == static_cast<std::size_t>(world_size()));  // every group ran trials
  auto const& best = grid.best_result();
  CHECK(best.config.at("x") == 2.0);
  CHECK(best.config.at("y") == 1.0);
  if (world_rank() == 0) {
    auto exp = storage / "grid";
    CHECK(lines_of(exp / "trials.csv") == 19);
    CHECK(std::filesystem::exists(exp / "experiment_state.json"));
    CHECK(lines_of(exp / "trial_00017" / "result.json") == 3);
    CHECK(std::filesystem::exists(exp / "trial_00017" / "params.json"));
  }
}

TEST_CASE("ranks_per_trial splits the world into groups that each run one trial at a time", "[tuning][mpi]") {
  int const n = world_size();
  int const per = n == 1 ? 1 : 2;
  auto const storage = cohort_test::scratch("tune_groups");
  cohort::tuner tuner{quadratic{.iterations = 2, .sleep_ms = 20},
                      cohort::tune_config{.metric = "score", .num_samples = 6, .ranks_per_trial = per, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 4)}, {"y", 1.0}},
                        {.name = "groups", .storage_path = storage.string(), .verbose = 0});
  if (n % per != 0) {  // 3 ranks cannot form groups of 2: one line on every rank, no hang
    REQUIRE_FALSE(grid.ok());
    CHECK_THAT(*grid.error, contains_text("tune_config.ranks_per_trial = 2 does not divide the 3 ranks"));
    return;
  }
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 6);
  // Trials overlap in time at most as many at once as there are groups.
  std::vector<std::pair<double, double>> spans;
  for (auto const& t : grid.trials) {
    CHECK(t.metrics.at("group_size") == per);
    CHECK(t.metrics.at("rank").get<int>() % per == 0);  // reported by each group's leader
    double const start = t.metrics_history.front().at("start").get<double>();
    spans.push_back({start, start + t.metrics.at("time_total_s").get<double>()});
  }
  int most = 0;
  for (auto const& [s, e] : spans) {
    int overlapping = 0;
    for (auto const& [s2, e2] : spans) overlapping += (s2 <= s && s < e2) ? 1 : 0;
    most = std::max(most, overlapping);
  }
  CHECK(most <= n / per);
}

TEST_CASE("ASHA stops poor trials at its rungs and lets the best reach max_t", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_asha");
  cohort::tuner tuner{quadratic{.iterations = 9, .sleep_ms = 0},
                      cohort::schedule::asha{.max_t = 9, .grace_period = 1, .reduction_factor = 3},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0})}, {"y", 1.0}},
                        {.name = "asha", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  std::size_t stopped_early = 0;
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    stopped_early += t.metrics_history.size() < 9 ? 1 : 0;
  }
  CHECK(stopped_early >= 1);
  auto const& best = grid.best_result();
  CHECK(best.config.at("x") == 2.0);
  CHECK(best.metrics_history.size() == 9);  // the best trial is never stopped before max_t
}

TEST_CASE("stoppers end trials on a threshold and the experiment on a time budget", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_stop");
  cohort::tuner tuner{quadratic{.iterations = 5, .sleep_ms = 0}, cohort::stop::thresholds{{"training_iteration", 2}},
                      cohort::tune_config{.metric = "score", .num_samples = 4, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 4)}, {"y", 0.0}},
                        {.name = "stop", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 4);
  for (auto const& t : grid.trials) CHECK(t.metrics_history.size() == 2);

  cohort::tuner budget{quadratic{.iterations = 1000, .sleep_ms = 1}, cohort::stop::time_budget{.time_budget_s = 0.3},
                       cohort::tune_config{.metric = "score", .num_samples = 100, .status_interval_s = 1e9}};
  auto cut = budget.fit(cohort::space{{"x", cohort::uniform(0, 4)}, {"y", 0.0}},
                        {.name = "budget", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(cut.ok());
  CHECK(cut.size() < 100);
  for (auto const& t : cut.trials) CHECK(t.metrics_history.size() < 1000);
}

TEST_CASE("a trial that throws is an ERROR trial; the others go on", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_error");
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) {
    if (config.at("x").get<int>() == 1) throw std::runtime_error("x = 1 is broken");
    ctx.report({{"score", config.at("x").get<int>()}});
  };
  cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({0, 1, 2})}},
                        {.name = "error", .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 5000});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 3);
  CHECK(grid.num_errors() == 1);
  CHECK_THAT(grid.trials[1].error.value_or(""), contains_text("x = 1 is broken"));
  CHECK(grid.best_result().config.at("x") == 2);
}
