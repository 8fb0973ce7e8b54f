#include <cohort/tuning/stoppers.hpp>

#include <string>
#include <vector>

#include "../catch.hpp"

using nlohmann::json;
namespace stop = cohort::stop;

namespace {

/// The stopper's answers to the trial's values of `metric`, one result each.
template <class S>
std::vector<bool> answers(S& s, std::string const& trial, std::string const& metric,
                          std::vector<double> const& values) {
  std::vector<bool> out;
  for (double v : values) out.push_back(s.stop_trial(trial, json{{metric, v}}));
  return out;
}

}  // namespace

TEST_CASE("the stop criteria satisfy the stopper concept", "[tuning][pure]") {
  STATIC_REQUIRE(cohort::stopper<stop::thresholds>);
  STATIC_REQUIRE(cohort::stopper<stop::function>);
  STATIC_REQUIRE(cohort::stopper<stop::plateau>);
  STATIC_REQUIRE(cohort::stopper<stop::time_budget>);
  STATIC_REQUIRE(cohort::stopper<stop::maximum_iterations>);
}

TEST_CASE("thresholds stop a trial once any key reaches its value", "[tuning][pure]") {
  stop::thresholds t{{"mean_accuracy", 0.99}, {"training_iteration", 100}};
  CHECK_FALSE(t.stop_trial("a", {{"mean_accuracy", 0.5}, {"training_iteration", 1}}));
  CHECK(t.stop_trial("a", {{"mean_accuracy", 0.99}, {"training_iteration", 2}}));  // >=, not >
  CHECK(t.stop_trial("a", {{"mean_accuracy", 0.5}, {"training_iteration", 100}}));
  CHECK_FALSE(t.stop_all(1e9));

  stop::thresholds nested{{"eval/acc", 0.9}};
  CHECK(nested.stop_trial("a", {{"eval", {{"acc", 0.95}}}}));  // a path into nested objects
  CHECK(nested.stop_trial("a", {{"eval/acc", 0.95}}));         // or the flattened key
  CHECK_FALSE(nested.stop_trial("a", {{"eval", {{"acc", 0.5}}}}));

  CHECK_THROWS_WITH(t.stop_trial("a", {{"training_iteration", 1}}),
                    contains_text("has no \"mean_accuracy\" (its keys: training_iteration)"));
  CHECK_THROWS_WITH(nested.stop_trial("a", {{"eval", {{"acc", "high"}}}}), contains_text("not a number"));
  CHECK_THROWS_WITH(stop::thresholds({{"", 1.0}}), contains_text("empty key"));
  CHECK_FALSE(stop::thresholds{}.stop_trial("a", json::object()));
}

TEST_CASE("a function stopper asks the function", "[tuning][pure]") {
  stop::function f{.fn = [](std::string const& id, json const& r) { return id == "b" || r["loss"] < 0.1; }};
  CHECK_FALSE(f.stop_trial("a", {{"loss", 0.5}}));
  CHECK(f.stop_trial("a", {{"loss", 0.05}}));
  CHECK(f.stop_trial("b", {{"loss", 0.5}}));
  CHECK_FALSE(f.stop_all(0));
  CHECK_THROWS_WITH(stop::function{}.stop_trial("a", {}), contains_text(".fn is empty"));
}

TEST_CASE("plateau stops a trial whose last values barely move", "[tuning][pure]") {
  std::vector<double> const loss{1.0, 0.5, 0.3, 0.301, 0.302, 0.303};
  // Results 1-3: fewer than grace_period 4. Result 4: std of {1, .5, .3, .301} ~ 0.27. Result 5:
  // {.5, .3, .301, .302}: mean .35075, std ~ 0.086. Result 6: {.3, .301, .302, .303}: mean .3015,
  // deviations +-.0015, +-.0005, std = sqrt(5e-6 / 4) ~ 0.0011 < 0.01: stop.
  SECTION("without a threshold") {
    stop::plateau p{.metric = "loss"};
    CHECK(answers(p, "a", "loss", loss) == std::vector<bool>{false, false, false, false, false, true});
  }
  SECTION("with a threshold the latest value must be at or better than it") {
    stop::plateau above{.metric = "loss", .metric_threshold = 0.2, .mode = cohort::min};  // .303 > .2: not yet
    CHECK(answers(above, "a", "loss", loss).back() == false);
    stop::plateau below{.metric = "loss", .metric_threshold = 0.5, .mode = cohort::min};  // .303 <= .5
    CHECK(answers(below, "a", "loss", loss).back() == true);
    stop::plateau max{.metric = "loss", .metric_threshold = 0.5, .mode = cohort::max};  // .303 < .5
    CHECK(answers(max, "a", "loss", loss).back() == false);
  }
  SECTION("the grace period counts results, the window num_results") {
    stop::plateau p{.metric = "m", .num_results = 2, .grace_period = 6};
    CHECK(answers(p, "a", "m", {1, 1, 1, 1, 1, 1}) == std::vector<bool>{false, false, false, false, false, true});
  }
  SECTION("a missing metric never plateaus until it leaves the window") {
    stop::plateau p{.metric = "m"};
    std::vector<bool> got;
    for (json r : {json{{"m", 1}}, json{{"m", 1}}, json{{"m", 1}}, json{{"other", 1}}, json{{"m", 1}}, json{{"m", 1}},
                   json{{"m", 1}}, json{{"m", 1}}})
      got.push_back(p.stop_trial("a", r));
    CHECK(got == std::vector<bool>{false, false, false, false, false, false, false, true});
  }
  SECTION("trials are tracked apart") {
    stop::plateau p{.metric = "m", .num_results = 2, .grace_period = 2};
    CHECK_FALSE(p.stop_trial("a", {{"m", 1}}));
    CHECK_FALSE(p.stop_trial("b", {{"m", 1}}));  // b has one result only
    CHECK(p.stop_trial("a", {{"m", 1}}));
    CHECK_FALSE(p.stop_trial("b", {{"m", 5}}));
  }
  SECTION("bad knobs") {
    CHECK_THROWS_WITH(stop::plateau{}.stop_trial("a", {}), contains_text(".metric is empty"));
    CHECK_THROWS_WITH((stop::plateau{.metric = "m", .num_results = 0}.stop_trial("a", {})),
                      contains_text(".num_results must be at least 1"));
    CHECK_THROWS_WITH((stop::plateau{.metric = "m", .std = -1}.stop_all(0)), contains_text(".std must be positive"));
    CHECK_THROWS_WITH((stop::plateau{.metric = "m", .metric_threshold = 0.0}.stop_trial("a", {})),
                      contains_text(".metric_threshold needs .mode"));
  }
}

TEST_CASE("a time budget ends the experiment once it is spent", "[tuning][pure]") {
  stop::time_budget t{.time_budget_s = 10};
  CHECK_FALSE(t.stop_all(9.99));
  CHECK(t.stop_all(10));
  CHECK(t.stop_all(11));
  CHECK_FALSE(t.stop_trial("a", {{"training_iteration", 1000}}));
  CHECK(stop::time_budget{.time_budget_s = 0}.stop_all(0));
  CHECK_THROWS_WITH(stop::time_budget{.time_budget_s = -1}.stop_all(0), contains_text(".time_budget_s is -1"));
  CHECK_THROWS_WITH(stop::time_budget{}.stop_all(0), contains_text("set it to the experiment's budget in seconds"));
}

TEST_CASE("maximum_iterations stops each trial at its max_iter-th result", "[tuning][pure]") {
  stop::maximum_iterations m{.max_iter = 3};
  CHECK_FALSE(m.stop_trial("a", {}));
  CHECK_FALSE(m.stop_trial("a", {}));
  CHECK_FALSE(m.stop_trial("b", {}));
  CHECK(m.stop_trial("a", {}));  // a's third result
  CHECK(m.stop_trial("a", {}));
  CHECK_FALSE(m.stop_trial("b", {}));
  CHECK_FALSE(m.stop_all(1e9));
  CHECK_THROWS_WITH(stop::maximum_iterations{}.stop_trial("a", {}),
                    contains_text(".max_iter is 0; set it to 1 or more"));
}
