#include <cohort/tuning/schedulers.hpp>
#include <cohort/tuning/schedule/hyperband_brackets.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../catch.hpp"

using cohort::tuning::decision;
using cohort::tuning::objective;
using nlohmann::json;
namespace schedule = cohort::schedule;

namespace {

/// A result as the tuner fills it in: the iteration and one metric.
json at(double iteration, std::string const& metric, double value) {
  return {{"training_iteration", iteration}, {metric, value}, {"time_total_s", iteration * 10.0}};
}

/// One reported result: trial, iteration, metric value.
struct report {
  std::string trial;
  double iteration;
  double value;
};

/// Feeds the reports in order (adding each trial before its first report, unless `added`) and
/// returns the decisions.
template <class S>
std::vector<decision> replay(S& s, std::vector<report> const& reports, std::string const& metric = "score",
                             double sign = 1.0) {
  std::set<std::string> added;
  std::vector<decision> out;
  for (auto const& r : reports) {
    if (added.insert(r.trial).second) s.on_trial_add(r.trial, json::object());
    out.push_back(s.on_trial_result(r.trial, at(r.iteration, metric, sign * r.value)).what);
  }
  return out;
}

constexpr auto go = decision::proceed;
constexpr auto halt = decision::stop;
constexpr auto hold = decision::pause;

}  // namespace

TEST_CASE("the scheduling policies satisfy the scheduler concept", "[tuning][pure]") {
  STATIC_REQUIRE(cohort::scheduler<schedule::fifo>);
  STATIC_REQUIRE(cohort::scheduler<schedule::asha>);
  STATIC_REQUIRE(cohort::scheduler<schedule::median_stopping>);
  STATIC_REQUIRE(cohort::scheduler<schedule::pbt>);
}

TEST_CASE("fifo lets every trial proceed", "[tuning][pure]") {
  schedule::fifo f;
  f.setup({});
  f.on_trial_add("a", json::object());
  for (int i = 1; i < 5; ++i) CHECK(f.on_trial_result("a", at(i, "score", -i)).what == go);
  CHECK(f.save_state() == json::object());
  CHECK(f.debug_string() == "Using FIFO scheduling algorithm.");
  auto const span = f.proceeds("a");  // every result: the tuner need not wait for fifo's answers
  CHECK(span.key.empty());
  CHECK(span.below == std::numeric_limits<double>::infinity());
}

TEST_CASE("numpy's linear nanpercentile is reproduced", "[tuning][pure]") {
  using schedule::detail::nan_percentile;
  double const nan = std::nan("");
  // Values from numpy 2.x, np.nanpercentile(values, q).
  CHECK(nan_percentile({1, 2, 4}, 75) == 3.0);       // index 1.5: 4 - (4 - 2) * 0.5
  CHECK(nan_percentile({4, 1, 3, 2}, 75) == 3.25);   // sorted, index 2.25: 3 + 1 * 0.25
  CHECK(nan_percentile({1, nan, 2, 4}, 75) == 3.0);  // NaN dropped
  CHECK(nan_percentile({0.1, 0.2, 0.7}, 100 * (1 - 1.0 / 3)) == Approx(0.3666666666666667));
  CHECK(nan_percentile({5}, 50) == 5.0);
  CHECK(std::isnan(nan_percentile({nan}, 50)));
  CHECK(std::isnan(nan_percentile({}, 50)));
}

TEST_CASE("asha places rungs as Ray does", "[tuning][pure]") {
  // MAX_RUNGS = int(log(8 / 1) / log(2) - s + 1): 4 for bracket 0, 3 for 1, 2 for 2; largest first.
  schedule::asha a{.max_t = 8, .grace_period = 1, .reduction_factor = 2, .brackets = 3};
  CHECK(a.milestones(0) == std::vector<double>{8, 4, 2, 1});
  CHECK(a.milestones(1) == std::vector<double>{8, 4, 2});
  CHECK(a.milestones(2) == std::vector<double>{8, 4});
  // Ray's defaults: int(log(100) / log(4) + 1) = int(4.32) = 4 rungs, 4^3 .. 4^0.
  CHECK(schedule::asha{}.milestones() == std::vector<double>{64, 16, 4, 1});
}

TEST_CASE("asha stops trials below the median of a rung, and all trials at max_t", "[tuning][pure]") {
  // grace 1, rf 2, max_t 8: rungs at 8, 4, 2, 1; the cutoff is the 50th percentile of the values
  // recorded at a rung before. Checked against Ray 2.9.0's AsyncHyperBandScheduler.
  schedule::asha a{.metric = "score", .max_t = 8, .grace_period = 1, .reduction_factor = 2};
  a.setup({});
  std::vector<report> reports{
      {"A", 1, 4},   // rung 1 empty: no cutoff; records A=4
      {"B", 1, 6},   // rung 1 {4}: cutoff 4; 6 >= 4 proceeds
      {"C", 1, 3},   // rung 1 {4,6}: index 0.5 -> 6 - 2*0.5 = 5; 3 < 5 stops
      {"D", 1, 5},   // rung 1 {3,4,6}: index 1.0 -> 4; 5 >= 4 proceeds
      {"A", 2, 7},   // rung 2 empty: records A=7
      {"B", 2, 5},   // rung 2 {7}: cutoff 7; 5 < 7 stops
      {"D", 2, 8},   // rung 2 {5,7}: 7 - 2*0.5 = 6; 8 >= 6 proceeds
      {"A", 3, 7},   // no new rung reached (2 and 1 recorded, 4 not reached)
      {"D", 3, 9},   // likewise
      {"A", 4, 8},   // rung 4 empty: records A=8
      {"D", 4, 10},  // rung 4 {8}: cutoff 8; 10 >= 8 proceeds
      {"A", 7, 17},  // no new rung
      {"A", 8, 18},  // 8 >= max_t: stops (stop_last_trials)
      {"D", 8, 18},  // likewise
  };
  CHECK(replay(a, reports) == std::vector<decision>{go, go, halt, go, go, halt, go, go, go, go, go, go, halt, halt});
  CHECK(a.num_stopped() == 4);
  // The status table's lines (Ray's debug_string): each rung's cutoff over what it recorded, 8:
  // nothing (a trial at max_t stops before its bracket records it, as in Ray), 4: {8, 10},
  // 2: {5, 7, 8}, 1: {3, 4, 5, 6}.
  CHECK(a.debug_string() == "Using AsyncHyperBand: num_stopped=4\nBracket: Iter 8.000: None | Iter 4.000: 9 | Iter 2.000: 7 | Iter 1.000: 4.5");

  SECTION("mode min on the negated metric decides the same") {
    schedule::asha fresh{.metric = "score", .max_t = 8, .grace_period = 1, .reduction_factor = 2};
    fresh.setup({});
    CHECK(fresh.debug_string() == "Using AsyncHyperBand: num_stopped=0\nBracket: Iter 8.000: None | Iter 4.000: None | Iter 2.000: None | Iter 1.000: None");
    schedule::asha negated{.max_t = 8, .grace_period = 1, .reduction_factor = 2};
    negated.setup({.metric = "loss", .mode = cohort::min});
    CHECK(replay(negated, reports, "loss", -1.0) == replay(fresh, reports));
    // Cutoffs in the metric's own units: the loss a trial must stay at or below.
    CHECK(negated.debug_string() == "Using AsyncHyperBand: num_stopped=4\nBracket: Iter 8.000: None | Iter 4.000: -9 | Iter 2.000: -7 | Iter 1.000: -4.5");
  }
}

TEST_CASE("asha's default 75th-percentile cutoff interpolates between recorded values", "[tuning][pure]") {
  // rf 4: the cutoff is nanpercentile(recorded, 75). Checked against Ray 2.9.0.
  schedule::asha a{.metric = "score"};
  a.setup({});
  CHECK(replay(a, {
                      {"A", 1, 1},    // no cutoff
                      {"B", 1, 2},    // {1}: 1
                      {"C", 1, 3},    // {1,2}: index 0.75 -> 2 - 1*0.25 = 1.75
                      {"D", 1, 4},    // {1,2,3}: index 1.5 -> 3 - 1*0.5 = 2.5
                      {"E", 1, 3.2},  // {1,2,3,4}: index 2.25 -> 3 + 1*0.25 = 3.25; 3.2 < 3.25 stops
                      {"F", 1, 3.3},  // {1,2,3,3.2,4}: index 3 -> 3.2; 3.3 >= 3.2 proceeds
                  }) == std::vector<decision>{go, go, go, go, halt, go});
}

TEST_CASE("asha without stop_last_trials records at max_t and lets the trial go on", "[tuning][pure]") {
  schedule::asha a{.metric = "score", .max_t = 2, .grace_period = 1, .reduction_factor = 2, .stop_last_trials = false};
  a.setup({});
  // rungs 2, 1. A: rung 1 then rung 2 recorded; at 3 it has recorded at rung 2 -> break, proceed.
  // B at 2: rung 2 {A=5}: cutoff 5; 1 < 5 stops.
  CHECK(replay(a, {{"A", 1, 1}, {"A", 2, 5}, {"A", 3, 5}, {"B", 1, 2}, {"B", 2, 1}}) ==
        std::vector<decision>{go, go, go, go, halt});
}

TEST_CASE("asha's proceed span: below the next milestone a trial has not recorded at, and below max_t", "[tuning][pure]") {
  schedule::asha a{.metric = "score", .max_t = 8, .grace_period = 1, .reduction_factor = 2};  // rungs 8, 4, 2, 1
  a.setup({});
  CHECK(a.proceeds("A").below == -std::numeric_limits<double>::infinity());  // not added: nothing is sure
  a.on_trial_add("A", json::object());
  CHECK(a.proceeds("A").key == "training_iteration");
  CHECK(a.proceeds("A").below == 1);
  a.on_trial_result("A", at(1, "score", 5));
  CHECK(a.proceeds("A").below == 2);
  a.on_trial_result("A", at(3, "score", 5));  // records at the rung at 2
  CHECK(a.proceeds("A").below == 4);
  a.on_trial_result("A", at(4, "score", 5));
  CHECK(a.proceeds("A").below == 8);  // the rung at 8, which is max_t too
  schedule::asha long_run{.metric = "score", .max_t = 6, .grace_period = 1, .reduction_factor = 4};  // rungs 4, 1
  long_run.setup({});
  long_run.on_trial_add("A", json::object());
  long_run.on_trial_result("A", at(1, "score", 1));
  long_run.on_trial_result("A", at(4, "score", 1));
  CHECK(long_run.proceeds("A").below == 6);  // max_t: stop_last_trials
  schedule::asha endless{.metric = "score", .max_t = 6, .grace_period = 1, .reduction_factor = 4, .stop_last_trials = false};
  endless.setup({});
  endless.on_trial_add("A", json::object());
  endless.on_trial_result("A", at(1, "score", 1));
  endless.on_trial_result("A", at(4, "score", 1));
  CHECK(endless.proceeds("A").below == std::numeric_limits<double>::infinity());
}

TEST_CASE("asha answers proceed to every result inside the span it gave, whatever the others report", "[tuning][pure]") {
  // Random curves in 3 brackets, reported in a random interleaving: before each result the span
  // is taken; a result inside it must be answered proceed (the tuner does not wait for it).
  std::mt19937_64 rng(11);
  for (int round = 0; round < 20; ++round) {
    schedule::asha a{.metric = "score", .max_t = 40, .grace_period = 1, .reduction_factor = 3, .brackets = 3, .seed = 5};
    a.setup({});
    std::vector<double> t(8, 0);
    for (std::size_t k = 0; k < t.size(); ++k) a.on_trial_add("T" + std::to_string(k), json::object());
    std::vector<bool> live(t.size(), true);
    std::size_t inside = 0, stops = 0;
    for (int step = 0; step < 400; ++step) {
      auto const k = std::uniform_int_distribution<std::size_t>(0, t.size() - 1)(rng);
      if (!live[k]) continue;
      auto const id = "T" + std::to_string(k);
      t[k] += std::uniform_int_distribution<int>(1, 3)(rng);
      auto const span = a.proceeds(id);
      auto const d = a.on_trial_result(id, at(t[k], "score", std::uniform_real_distribution<double>(0, 1)(rng))).what;
      if (t[k] < span.below) {
        ++inside;
        CHECK(d == go);
      }
      if (d != go) {
        ++stops;
        live[k] = false;
        a.on_trial_complete(id, at(t[k], "score", 0));
      }
    }
    CHECK(inside > 0);
    CHECK(stops > 0);
  }
}

TEST_CASE("asha counts a completed trial's last result at the rung it reached", "[tuning][pure]") {
  schedule::asha a{.metric = "score", .max_t = 8, .grace_period = 1, .reduction_factor = 2};
  a.setup({});
  a.on_trial_add("A", json::object());
  a.on_trial_complete("A", at(1, "score", 10));  // records A=10 at rung 1, forgets A
  a.on_trial_add("B", json::object());
  CHECK(a.on_trial_result("B", at(1, "score", 9)).what == halt);  // cutoff 10
  a.on_trial_complete("B", nullptr);                              // a failed trial: nothing to record
  CHECK_THROWS_WITH(a.on_trial_result("B", at(2, "score", 9)), contains_text("never added"));
}

TEST_CASE("asha deals trials to brackets reproducibly and round-trips its state", "[tuning][pure]") {
  auto make = [] {
    schedule::asha a{.metric = "score", .max_t = 8, .grace_period = 1, .reduction_factor = 2, .brackets = 3, .seed = 7};
    a.setup({});
    return a;
  };
  auto a = make(), b = make();
  std::vector<report> first, second;
  for (int t = 0; t < 12; ++t) first.push_back({"t" + std::to_string(t), 1, double((t * 7) % 5)});
  for (int t = 0; t < 12; ++t) second.push_back({"t" + std::to_string(t), 2, double((t * 3) % 4)});
  CHECK(replay(a, first) == replay(b, first));
  CHECK(a.trial_brackets() == b.trial_brackets());
  std::set<std::size_t> used;
  for (auto const& [id, br] : a.trial_brackets()) used.insert(br);
  CHECK(used.size() > 1);  // softmax over sizes {4, 3, 2}: p = {0.67, 0.24, 0.09}

  auto restored = make();
  restored.restore_state(json::parse(a.save_state().dump()));
  CHECK(restored.save_state() == a.save_state());
  std::vector<decision> da, dr;
  for (auto const& r : second) {
    da.push_back(a.on_trial_result(r.trial, at(r.iteration, "score", r.value)).what);
    dr.push_back(restored.on_trial_result(r.trial, at(r.iteration, "score", r.value)).what);
  }
  CHECK(da == dr);
  a.on_trial_add("late", json::object());
  restored.on_trial_add("late", json::object());
  CHECK(a.trial_brackets().at("late") == restored.trial_brackets().at("late"));
}

TEST_CASE("asha rejects bad knobs and results without its keys", "[tuning][pure]") {
  CHECK_THROWS_WITH(schedule::asha{}.setup({}),
                    contains_text("set schedule::asha's .metric or the tuner's objective metric"));
  CHECK_THROWS_WITH((schedule::asha{.max_t = 2, .grace_period = 4}.setup({.metric = "m"})),
                    contains_text(".grace_period must be at most .max_t"));
  CHECK_THROWS_WITH(schedule::asha{.reduction_factor = 1}.setup({.metric = "m"}), contains_text(".reduction_factor"));
  CHECK_THROWS_WITH(schedule::asha{.brackets = 0}.setup({.metric = "m"}), contains_text(".brackets"));
  CHECK_THROWS_WITH(schedule::asha{}.on_trial_add("a", {}), contains_text("before setup"));

  schedule::asha a;
  a.setup({.metric = "score"});
  a.on_trial_add("a", json::object());
  CHECK_THROWS_WITH(a.on_trial_result("a", json{{"training_iteration", 1}, {"loss", 0.5}}),
                    contains_text("has no \"score\" (its keys: loss, training_iteration)"));
  CHECK_THROWS_WITH(a.on_trial_result("a", json{{"score", 1}}), contains_text("has no \"training_iteration\""));
  CHECK_THROWS_WITH(a.on_trial_result("a", json{{"training_iteration", 1}, {"score", "high"}}),
                    contains_text("not a number"));
}

TEST_CASE("a scheduler's own metric overrides the objective, and nested metrics are found", "[tuning][pure]") {
  schedule::asha a{.metric = "eval/acc", .mode = cohort::max, .max_t = 8, .grace_period = 1, .reduction_factor = 2};
  a.setup({.metric = "loss", .mode = cohort::min});
  a.on_trial_add("A", json::object());
  a.on_trial_add("B", json::object());
  CHECK(a.on_trial_result("A", {{"training_iteration", 1}, {"eval", {{"acc", 0.5}}}}).what == go);
  CHECK(a.on_trial_result("B", {{"training_iteration", 1}, {"eval/acc", 0.25}}).what == halt);  // 0.25 < 0.5
}

TEST_CASE("the median rule stops a trial whose best is below the median of the others' running means",
          "[tuning][pure]") {
  // time = training_iteration, grace 2, at least 2 other trials that reached t. Running means
  // over results with 2 <= time <= t. Checked against Ray 2.9.0's MedianStoppingRule.
  std::vector<report> reports{
      {"A", 1, 1},    // t < grace: proceed
      {"B", 1, 3},    // likewise
      {"C", 1, 2},    // likewise
      {"D", 1, 5},    // likewise
      {"A", 2, 2},    // nobody else reached 2: too few samples, nobody waits: proceed
      {"B", 2, 4},    // only A reached 2: proceed
      {"C", 2, 1},    // A 2, B 4: median (2+4)/2 = 3; C's best max(2,1) = 2 < 3: stop
      {"D", 2, 6},    // A 2, B 4, C 1: median 2; best 6: proceed
      {"D", 3, 7},    // nobody else reached 3: proceed
      {"B", 3, 5},    // only D reached 3: proceed
      {"A", 3, 2.5},  // D mean(6,7) = 6.5, B mean(4,5) = 4.5: median 5.5; best 2.5: stop
  };
  auto const expected = std::vector<decision>{go, go, go, go, go, go, halt, go, go, go, halt};
  schedule::median_stopping m{
      .time_attr = "training_iteration", .metric = "score", .grace_period = 2, .min_samples_required = 2};
  m.setup({});
  CHECK(replay(m, reports) == expected);
  CHECK(m.debug_string() == "Using MedianStoppingRule: num_stopped=2.");

  SECTION("in mode min on the negated metric") {
    schedule::median_stopping n{.time_attr = "training_iteration", .grace_period = 2, .min_samples_required = 2};
    n.setup({.metric = "loss", .mode = cohort::min});
    CHECK(replay(n, reports, "loss", -1.0) == expected);
  }
  SECTION("pausing instead with hard_stop false, then proceeding whatever it reports") {
    schedule::median_stopping s{.time_attr = "training_iteration",
                                .metric = "score",
                                .grace_period = 2,
                                .min_samples_required = 2,
                                .hard_stop = false};
    s.setup({});
    std::vector<report> soft(reports.begin(), reports.begin() + 7);
    soft.push_back({"C", 3, -9});  // resumed: FIFO from now on
    CHECK(replay(s, soft) == std::vector<decision>{go, go, go, go, go, go, hold, go});
  }
}

TEST_CASE("the median rule yields to paused trials when it lacks samples", "[tuning][pure]") {
  // grace 1, one other trial needed, hard_stop false. Checked against Ray 2.9.0 (trials PAUSED
  // by the rule count as waiting; a trial added but not yet reporting counts as running).
  auto make = [](double min_time_slice) {
    schedule::median_stopping m{.time_attr = "training_iteration",
                                .metric = "score",
                                .grace_period = 1,
                                .min_samples_required = 1,
                                .min_time_slice = min_time_slice,
                                .hard_stop = false};
    m.setup({});
    m.on_trial_add("A", json::object());
    m.on_trial_add("B", json::object());
    return m;
  };
  SECTION("with no min_time_slice it pauses whenever another trial waits") {
    auto m = make(0);
    CHECK(replay(m, {
                        {"A", 1, 5},  // nobody else reached 1, nobody waits (B added, not reporting): proceed
                        {"B", 1, 1},  // A's mean 5 > B's best 1: paused (waits from now on)
                        {"A", 2, 5},  // nobody else reached 2, B waits: yield
                        {"A", 3, 5},  // 3 - 2 > 0: yield again
                    }) == std::vector<decision>{go, hold, hold, hold});
  }
  SECTION("min_time_slice spaces the yields out") {
    auto m = make(5);
    // A yields at 2 (2 - (-inf) > 5), not at 3 or 7 (1, 5 past it), again at 8. B, resumed, is
    // past judging (FIFO) and no longer waits, so A proceeds at 20.
    CHECK(replay(m, {{"A", 1, 5},
                     {"B", 1, 1},
                     {"A", 2, 5},
                     {"A", 3, 5},
                     {"A", 7, 5},
                     {"A", 8, 5},
                     {"B", 2, 1},
                     {"A", 20, 5}}) == std::vector<decision>{go, hold, hold, go, go, hold, go, go});
  }
}

TEST_CASE("the median rule leaves out trials with no result in the window", "[tuning][pure]") {
  // Ray would average nothing (NaN) for X and stop Y; here X is left out and Y proceeds.
  schedule::median_stopping m{.metric = "score", .grace_period = 60, .min_samples_required = 1};
  m.setup({});
  m.on_trial_add("X", json::object());
  CHECK(m.on_trial_result("X", {{"time_total_s", 50}, {"score", 10}}).what == go);
  CHECK(m.on_trial_result("X", {{"time_total_s", 200}, {"score", 10}}).what == go);  // nobody waits
  m.on_trial_add("Y", json::object());
  CHECK(m.on_trial_result("Y", {{"time_total_s", 100}, {"score", 1}}).what == go);
}

TEST_CASE("the median rule round-trips its state and keeps completed trials", "[tuning][pure]") {
  auto make = [] {
    schedule::median_stopping m{
        .time_attr = "training_iteration", .metric = "score", .grace_period = 2, .min_samples_required = 2};
    m.setup({});
    return m;
  };
  auto m = make();
  replay(m, {{"A", 1, 1}, {"B", 1, 3}, {"C", 1, 2}, {"A", 2, 2}, {"B", 2, 4}});
  m.on_trial_complete("B", at(2, "score", 4));  // already reported: not counted twice
  m.on_trial_complete("A", at(3, "score", 2));  // new: counted
  CHECK(m.results_held("B") == 2);
  CHECK(m.results_held("A") == 3);
  auto r = make();
  r.restore_state(json::parse(m.save_state().dump()));
  CHECK(r.save_state() == m.save_state());
  // C at 2: A mean(2) over [2,2] = 2, B 4: median 3; C's best 2: both stop it.
  CHECK(m.on_trial_result("C", at(2, "score", 1)).what == halt);
  CHECK(r.on_trial_result("C", at(2, "score", 1)).what == halt);
  CHECK_THROWS_WITH(schedule::median_stopping{}.setup({}), contains_text("needs a metric"));
}

namespace {

/// A pbt over lr (log range), bs (value list) and layers (integer range).
schedule::pbt population_pbt(double quantile, double resample, std::uint64_t seed = 1) {
  schedule::pbt p{
      .metric = "score",
      .hyperparam_mutations = {{"lr", schedule::mutation::range{.low = 1e-4, .high = 1.0, .log = true}},
                               {"bs", schedule::mutation::values({16, 32, 64, 128})},
                               {"layers", schedule::mutation::range{.low = 1, .high = 8, .integer = true}}},
      .quantile_fraction = quantile,
      .resample_probability = resample,
      .seed = seed,
  };
  p.setup({});
  p.on_trial_add("A", {{"lr", 0.01}, {"bs", 128}, {"layers", 8}, {"name", "a"}});
  p.on_trial_add("B", {{"lr", 0.1}, {"bs", 16}, {"layers", 1}, {"name", "b"}});
  p.on_trial_add("C", {{"lr", 0.001}, {"bs", 32}, {"layers", 4}, {"name", "c"}});
  p.on_trial_add("D", {{"lr", 0.5}, {"bs", 64}, {"layers", 2}, {"name", "d"}});
  return p;
}

/// Iterations 1-3 for all, then iteration 4 in the order C, B, A, D with scores 5, 8, 10, 1.
std::vector<cohort::tuning::scheduling_decision> four_iterations(schedule::pbt& p) {
  std::vector<cohort::tuning::scheduling_decision> out;
  for (int i = 1; i <= 3; ++i)
    for (auto id : {"A", "B", "C", "D"}) out.push_back(p.on_trial_result(id, at(i, "score", i)));
  for (auto [id, score] : {std::pair{"C", 5.0}, {"B", 8.0}, {"A", 10.0}, {"D", 1.0}})
    out.push_back(p.on_trial_result(id, at(4, "score", score)));
  return out;
}

}  // namespace

TEST_CASE("pbt: the bottom trial exploits the top one at the perturbation interval", "[tuning][pure]") {
  auto p = population_pbt(0.25, 0.0);
  auto d = four_iterations(p);
  REQUIRE(d.size() == 16);
  for (std::size_t i = 0; i < 12; ++i) CHECK(d[i].what == go);  // 1..3: 3 - 0 < perturbation_interval 4
  // At 4, each trial ranks the trials scored so far; q = min(ceil(n/4), floor(n/2)):
  CHECK(d[12].what == go);                   // C: n = 1, no quantiles
  CHECK(d[13].what == go);                   // B: n = 2, q = 1: lower [C 5], upper [B 8]; B is on top
  CHECK(d[14].what == go);                   // A: n = 3, q = 1: lower [C], upper [A 10]
  REQUIRE(d[15].what == decision::exploit);  // D: n = 4, q = 1: lower [D 1], upper [A 10]
  CHECK(d[15].donor == "A");
  // resample_probability 0: A's lr 0.01 * 1.2 or 0.8; bs 128 shifts to 64 or clamps at 128;
  // layers 8 * 1.2 = 9.6 -> 10 clamped to 8, or 8 * 0.8 = 6.4 -> 6; untouched keys are A's.
  auto const& c = d[15].config;
  CHECK_THAT(c["lr"].get<double>(), Catch::Matchers::WithinRel(0.012) || Catch::Matchers::WithinRel(0.008));
  CHECK((c["bs"] == 64 || c["bs"] == 128));
  CHECK(c["layers"].is_number_integer());
  CHECK((c["layers"] == 8 || c["layers"] == 6));
  CHECK(c["name"] == "a");
  CHECK(p.config_of("D") == c);
  CHECK(p.num_perturbations() == 1);
  CHECK(p.debug_string() == "PopulationBasedTraining: 1 perturbs");
  // A tuner that cannot carry the exploit out re-adds the trial with the config it keeps.
  auto q = population_pbt(0.25, 0.0);
  four_iterations(q);
  q.on_trial_add("D", {{"lr", 0.5}, {"bs", 64}, {"layers", 2}, {"name", "d"}});
  CHECK(q.config_of("D")["name"] == "d");
  // D took A's perturbation time (4): its next check is at 8, not 5.
  for (int i = 5; i < 8; ++i) CHECK(p.on_trial_result("D", at(i, "score", 0)).what == go);
}

TEST_CASE("pbt synch: trials pause at the common point until all are there, then the bottom exploits at once", "[tuning][pure]") {
  // Catches: a trial perturbed on its own at the point (asynchronous), a decision taken before
  // the population is complete (more trials to come), paused trials never resumed, the donor
  // drawn from scores taken at different points, the next point not moving on.
  auto make = [] {
    auto p = population_pbt(0.25, 0.0);
    p.synch = true;
    return p;
  };
  auto p = make();
  for (int i = 1; i <= 3; ++i)
    for (auto id : {"A", "B", "C", "D"}) CHECK(p.on_trial_result(id, at(i, "score", i)).what == go);
  CHECK(p.on_trial_result("C", at(4, "score", 5)).what == hold);
  CHECK(p.on_trial_result("B", at(4, "score", 8)).what == hold);
  CHECK(p.on_trial_result("A", at(4, "score", 10)).what == hold);
  CHECK(p.on_trial_result("D", at(4, "score", 1)).what == hold);  // the searcher may add more trials
  auto none = p.take_paused_decisions();
  CHECK((none.resume.empty() && none.exploit.empty()));
  auto r = make();  // the same, restored from the state saved while the four wait
  r.restore_state(json::parse(p.save_state().dump()));
  r.setup({});
  for (auto* q : {&p, &r}) {
    q->on_no_more_trials();
    auto d = q->take_paused_decisions();
    CHECK(d.resume == std::vector<std::string>{"A", "B", "C"});
    REQUIRE(d.exploit.size() == 1);  // n = 4, q = 1: D (1) exploits A (10)
    CHECK(d.exploit[0].first == "D");
    CHECK(d.exploit[0].second.what == decision::exploit);
    CHECK(d.exploit[0].second.donor == "A");
    CHECK(q->config_of("D") == d.exploit[0].second.config);
    CHECK(q->num_perturbations() == 1);
  }
  CHECK(p.save_state() == r.save_state());
  // The next point is 8: the reporting trial is the last to arrive and learns its own fate.
  for (auto id : {"A", "B", "C", "D"})
    for (int i = 5; i < 8; ++i) CHECK(p.on_trial_result(id, at(i, "score", 0)).what == go);
  CHECK(p.on_trial_result("A", at(8, "score", 3)).what == hold);
  CHECK(p.on_trial_result("B", at(8, "score", 4)).what == hold);
  p.on_trial_complete("C", at(8, "score", 9));  // ended: no longer waited for
  auto last = p.on_trial_result("D", at(8, "score", 2));
  CHECK(last.what == decision::exploit);  // n = 3, q = 1: D (2) exploits B (4)
  CHECK(last.donor == "B");
  CHECK(p.take_paused_decisions().resume == std::vector<std::string>{"A", "B"});
}

TEST_CASE("pbt: with quantile 0.5 the donor is one of the top half", "[tuning][pure]") {
  std::set<std::string> donors;
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    auto p = population_pbt(0.5, 0.0, seed);
    auto d = four_iterations(p);
    // C, B, A as before (q = 1 for n <= 3); D: q = 2, lower [D, C], upper [B, A].
    for (std::size_t i = 0; i < 15; ++i) CHECK(d[i].what == go);
    REQUIRE(d[15].what == decision::exploit);
    auto const& c = d[15].config;
    donors.insert(d[15].donor);
    if (d[15].donor == "B") {
      // B: lr 0.1 -> 0.12 or 0.08; bs 16 clamps at 16 or shifts to 32; layers 1*1.2 and 1*0.8 round to 1.
      CHECK_THAT(c["lr"].get<double>(), Catch::Matchers::WithinRel(0.12) || Catch::Matchers::WithinRel(0.08));
      CHECK((c["bs"] == 16 || c["bs"] == 32));
      CHECK(c["layers"] == 1);
      CHECK(c["name"] == "b");
    } else {
      REQUIRE(d[15].donor == "A");
      CHECK(c["name"] == "a");
    }
  }
  CHECK(donors == std::set<std::string>{"A", "B"});
}

TEST_CASE("pbt: resampling draws within the range or from the list", "[tuning][pure]") {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    auto p = population_pbt(0.25, 1.0, seed);
    auto c = four_iterations(p).back().config;
    CHECK(c["lr"].get<double>() >= 1e-4);
    CHECK(c["lr"].get<double>() <= 1.0);
    CHECK((c["bs"] == 16 || c["bs"] == 32 || c["bs"] == 64 || c["bs"] == 128));
    CHECK(c["layers"].is_number_integer());
    CHECK(c["layers"].get<int>() >= 1);
    CHECK(c["layers"].get<int>() <= 8);
  }
}

TEST_CASE("pbt: nothing happens before the interval, the burn-in, or without a top quantile", "[tuning][pure]") {
  SECTION("burn-in 6 delays the first check to iteration 6") {
    schedule::pbt p{.metric = "score",
                    .burn_in_period = 6,
                    .hyperparam_mutations = {{"lr", schedule::mutation::range{.low = 0.0, .high = 1.0}}}};
    p.setup({});
    p.on_trial_add("A", {{"lr", 0.5}});
    p.on_trial_add("B", {{"lr", 0.1}});
    for (int i = 1; i <= 5; ++i) {
      CHECK(p.on_trial_result("A", at(i, "score", 10)).what == go);
      CHECK(p.on_trial_result("B", at(i, "score", 1)).what == go);
    }
    CHECK(p.on_trial_result("A", at(6, "score", 10)).what == go);  // n = 1
    auto d = p.on_trial_result("B", at(6, "score", 1));            // n = 2, q = 1: B below A
    CHECK(d.what == decision::exploit);
    CHECK(d.donor == "A");
  }
  SECTION("quantile_fraction 0 never exploits") {
    auto p = population_pbt(0.0, 0.0);
    for (auto const& d : four_iterations(p)) CHECK(d.what == go);
  }
  SECTION("a finished trial is no donor") {
    auto p = population_pbt(0.25, 0.0);
    for (int i = 1; i <= 3; ++i)
      for (auto id : {"A", "B", "C", "D"}) p.on_trial_result(id, at(i, "score", i));
    CHECK(p.on_trial_result("A", at(4, "score", 10)).what == go);
    p.on_trial_complete("A", at(4, "score", 10));
    auto d = p.on_trial_result("D", at(4, "score", 1));  // n = 1 (A finished): nothing
    CHECK(d.what == go);
    CHECK(p.on_trial_result("B", at(4, "score", 8)).what == go);  // n = 2: lower [D], upper [B]
  }
}

TEST_CASE("pbt: the same seed gives the same exploits, and a restored state continues identically", "[tuning][pure]") {
  auto drive = [](schedule::pbt& p, int from, int to) {
    std::vector<json> out;
    for (int i = from; i <= to; ++i)
      for (auto [id, base] : {std::pair{"A", 4.0}, {"B", 3.0}, {"C", 2.0}, {"D", 1.0}}) {
        auto d = p.on_trial_result(id, at(i, "score", base + std::sin(i * base)));
        out.push_back({static_cast<int>(d.what), d.donor, d.config});
      }
    return out;
  };
  auto a = population_pbt(0.5, 0.25, 42), b = population_pbt(0.5, 0.25, 42);
  auto da = drive(a, 1, 12);
  CHECK(da == drive(b, 1, 12));
  CHECK(a.num_perturbations() > 0);

  auto restored = population_pbt(0.5, 0.25, 999);  // a different seed: the saved rng wins
  restored.restore_state(json::parse(a.save_state().dump()));
  CHECK(restored.save_state() == a.save_state());
  CHECK(drive(restored, 13, 30) == drive(a, 13, 30));
}

TEST_CASE("pbt: nested keys, custom resampling and custom explore", "[tuning][pure]") {
  schedule::pbt p{
      .metric = "loss",
      .mode = cohort::min,
      .hyperparam_mutations = {{"optim/lr", schedule::mutation::range{.low = 0.0, .high = 1.0}},
                               {"seed",
                                schedule::mutation::range{.resample = [](std::mt19937_64&) { return json(7); }}}},
      .resample_probability = 0.0,
      .custom_explore =
          [](json c, std::mt19937_64&) {
            c["explored"] = true;
            return c;
          },
  };
  p.setup({.metric = "ignored", .mode = cohort::max});
  p.on_trial_add("good", {{"optim", {{"lr", 0.5}}}});
  p.on_trial_add("bad", {{"optim", {{"lr", 0.25}}}});
  CHECK(p.on_trial_result("good", at(4, "loss", 0.1)).what == go);
  auto d = p.on_trial_result("bad", at(4, "loss", 0.9));  // min: 0.9 is worse
  REQUIRE(d.what == decision::exploit);
  CHECK(d.donor == "good");
  CHECK_THAT(d.config["optim"]["lr"].get<double>(), Catch::Matchers::WithinRel(0.6) || Catch::Matchers::WithinRel(0.4));
  CHECK(d.config["seed"] == 7);  // missing from the donor's config: drawn
  CHECK(d.config["explored"] == true);
}

TEST_CASE("pbt rejects bad knobs and results without its keys", "[tuning][pure]") {
  auto lr =
      std::vector<std::pair<std::string, schedule::mutation>>{{"lr", schedule::mutation::range{.low = 0, .high = 1}}};
  CHECK_THROWS_WITH((schedule::pbt{.metric = "m", .hyperparam_mutations = lr, .quantile_fraction = 0.6}.setup({})),
                    contains_text(".quantile_fraction must be between 0 and 0.5"));
  CHECK_THROWS_WITH(schedule::pbt{.metric = "m"}.setup({}),
                    contains_text("set .hyperparam_mutations or .custom_explore"));
  CHECK_THROWS_WITH((schedule::pbt{.metric = "m", .perturbation_interval = 0, .hyperparam_mutations = lr}.setup({})),
                    contains_text(".perturbation_interval must be positive"));
  CHECK_THROWS_WITH(
      (schedule::pbt{.metric = "m",
                     .hyperparam_mutations = {{"x", schedule::mutation::range{.low = 0, .high = 1, .log = true}}}}
           .setup({})),
      contains_text("needs .low > 0"));
  CHECK_THROWS_WITH(
      (schedule::pbt{.metric = "m", .hyperparam_mutations = {{"x", schedule::mutation::range{}}}}.setup({})),
      contains_text("needs a finite .low and .high, or a .resample function"));
  CHECK_THROWS_WITH(
      (schedule::pbt{.metric = "m", .hyperparam_mutations = {{"x", schedule::mutation::values({})}}}.setup({})),
      contains_text("is empty"));
  CHECK_THROWS_WITH((schedule::pbt{.hyperparam_mutations = lr}.setup({})), contains_text("needs a metric"));

  schedule::pbt p{.metric = "score", .hyperparam_mutations = lr};
  p.setup({});
  p.on_trial_add("a", {{"lr", 0.5}});
  CHECK_THROWS_WITH(p.on_trial_result("a", json{{"training_iteration", 1}}), contains_text("has no \"score\""));
  CHECK_THROWS_WITH(p.on_trial_result("z", at(1, "score", 1)), contains_text("never added"));
}

TEST_CASE("HyperBand's brackets are Ray's: trials and iterations at each milestone", "[tuning][pure]") {
  // The expected tables are Ray's HyperBandScheduler arithmetic (_get_n0, _get_r0,
  // _Bracket.successive_halving) evaluated in Python; max_t 81 and eta 3 are its defaults.
  using m = cohort::schedule::hyperband_milestone;
  auto milestones = [](std::int64_t max_t, double eta) {
    std::vector<std::pair<int, std::vector<m>>> out;
    for (auto const& b : cohort::schedule::hyperband_brackets(max_t, eta)) out.emplace_back(b.s, b.milestones);
    return out;
  };
  CHECK(milestones(81, 3) == std::vector<std::pair<int, std::vector<m>>>{
                                 {0, {{5, 81}}},
                                 {1, {{8, 27}, {3, 81}}},
                                 {2, {{15, 9}, {5, 36}, {2, 81}}},
                                 {3, {{34, 3}, {12, 12}, {4, 39}, {2, 81}}},
                                 {4, {{81, 1}, {27, 4}, {9, 13}, {3, 40}, {1, 81}}}});
  CHECK(milestones(9, 3) == std::vector<std::pair<int, std::vector<m>>>{
                                {0, {{3, 9}}}, {1, {{5, 3}, {2, 9}}}, {2, {{9, 1}, {3, 4}, {1, 9}}}});
  CHECK(milestones(100, 4) == std::vector<std::pair<int, std::vector<m>>>{
                                  {0, {{4, 100}}},
                                  {1, {{8, 25}, {2, 100}}},
                                  {2, {{22, 6}, {6, 30}, {2, 100}}},
                                  {3, {{64, 1}, {16, 5}, {4, 21}, {1, 85}}}});  // not a power of 4: ends short, as in Ray
  CHECK(milestones(2, 3) == std::vector<std::pair<int, std::vector<m>>>{{0, {{2, 2}}}});  // s = 1 too small: skipped
  CHECK_THROWS_WITH(cohort::schedule::hyperband_brackets(0, 3), contains_text("max_t must be at least 1"));
  CHECK_THROWS_WITH(cohort::schedule::hyperband_brackets(81, 1), contains_text("reduction factor must be above 1"));
}

namespace {

/// A HyperBand with max_t 9 and eta 3 (brackets: 3 trials to 9; 5 to 3 then 2 to 9; 9 to 1, 3 to
/// 4, 1 to 9), set up on "score", max, with `trials` added in order.
schedule::hyperband hyperband_9_3(std::vector<std::string> const& trials) {
  schedule::hyperband h{.max_t = 9, .reduction_factor = 3};
  h.setup({"score", cohort::order::max});
  for (auto const& t : trials) h.on_trial_add(t, json::object());
  return h;
}

std::vector<std::string> trials_named(int first, int last) {
  std::vector<std::string> out;
  for (int i = first; i <= last; ++i) out.push_back("t" + std::to_string(i));
  return out;
}

}  // namespace

TEST_CASE("HyperBand: trials settled before a suggestion are those of the brackets two back", "[tuning][pure]") {
  // Catches: a learning searcher waiting on trials that are paused until later trials join their
  // bracket (tune_config::reproducible would never end). max_t 9, eta 3: brackets of 3, 5, 9.
  auto h = hyperband_9_3({});
  CHECK(h.trials_settled_before(0) == 0);
  CHECK(h.trials_settled_before(7) == 0);    // bracket 1: none
  CHECK(h.trials_settled_before(8) == 3);    // bracket 2: bracket 0's three
  CHECK(h.trials_settled_before(16) == 3);
  CHECK(h.trials_settled_before(17) == 8);   // band 1, bracket 0: bands 0's brackets 0 and 1
  CHECK(h.trials_settled_before(20) == 17);  // band 1, bracket 1
}

TEST_CASE("HyperBand fills the brackets of a band in Ray's order, then starts the next band", "[tuning][pure]") {
  // Catches: a bracket overfilled or skipped, bands not restarting at s = 0.
  auto h = hyperband_9_3(trials_named(0, 17));
  using b = std::tuple<std::size_t, int, std::size_t, std::int64_t>;  // band, s, live trials, milestone
  CHECK(h.brackets() == std::vector<b>{{0, 0, 3, 9}, {0, 1, 5, 3}, {0, 2, 9, 1}, {1, 0, 1, 9}});
  STATIC_REQUIRE(cohort::scheduler<schedule::hyperband>);
}

TEST_CASE("HyperBand pauses at a milestone until the bracket's last trial reaches it, then the best go on and the rest stop", "[tuning][pure]") {
  // Catches: halving before every trial reported (asynchronous, ASHA's rule), the wrong number
  // kept (ceil(5 / 3) = 2), the worst kept, paused trials neither resumed nor stopped, the last
  // milestone not stopping everyone.
  auto h = hyperband_9_3(trials_named(0, 7));  // t0-t2: bracket 0; t3-t7: bracket 1 (5 trials, milestone 3)
  double const score[] = {0, 0, 0, 0.1, 0.5, 0.3, 0.9, 0.2};
  for (int i = 3; i <= 7; ++i)
    for (int it = 1; it <= 2; ++it) CHECK(h.on_trial_result("t" + std::to_string(i), at(it, "score", score[i])).what == go);
  for (int i = 3; i <= 6; ++i) CHECK(h.on_trial_result("t" + std::to_string(i), at(3, "score", score[i])).what == hold);
  auto none = h.take_paused_decisions();
  CHECK((none.resume.empty() && none.stop.empty()));
  CHECK(h.on_trial_result("t7", at(3, "score", score[7])).what == halt);  // 0.2: not among the best 2
  auto d = h.take_paused_decisions();
  CHECK(d.resume == std::vector<std::string>{"t4", "t6"});  // 0.5 and 0.9
  CHECK(d.stop == std::vector<std::string>{"t3", "t5"});
  CHECK(h.num_stopped() == 3);
  for (auto const& t : {"t3", "t5", "t7"}) h.on_trial_complete(t, json::object());
  for (int it = 4; it <= 8; ++it) CHECK(h.on_trial_result("t4", at(it, "score", 0.5)).what == go);
  CHECK(h.on_trial_result("t4", at(9, "score", 0.5)).what == hold);  // t6 is not at 9 yet
  CHECK(h.on_trial_result("t6", at(9, "score", 0.9)).what == halt);  // max_t: every trial stops
  CHECK(h.take_paused_decisions().stop == std::vector<std::string>{"t4"});
  CHECK_THAT(h.debug_string(), contains_text("Using HyperBand: num_stopped=3 total_brackets=2"));
  CHECK_THAT(h.debug_string(), contains_text("Bracket(Max Size (n)=2, Milestone (r)=9"));
}

TEST_CASE("HyperBand ranks for mode min, ties to the later trial, and a NaN lowest", "[tuning][pure]") {
  // Catches: min ranked as max; a tie broken otherwise than Ray's stable sort; a NaN kept.
  schedule::hyperband h{.metric = "loss", .mode = cohort::order::min, .max_t = 9, .reduction_factor = 3};
  h.setup({});
  for (auto const& t : trials_named(0, 7)) h.on_trial_add(t, json::object());
  double const nan = std::nan("");
  double const loss[] = {0, 0, 0, nan, 0.4, 0.4, 0.1, 0.7};
  for (int i = 3; i <= 6; ++i) CHECK(h.on_trial_result("t" + std::to_string(i), at(3, "loss", loss[i])).what == hold);
  CHECK(h.on_trial_result("t7", at(3, "loss", loss[7])).what == halt);
  auto d = h.take_paused_decisions();
  CHECK(d.resume == std::vector<std::string>{"t5", "t6"});  // 0.1, and of the two 0.4 the later
  CHECK(d.stop == std::vector<std::string>{"t3", "t4"});
}

TEST_CASE("HyperBand: a bracket that will not fill is decided once the searcher is exhausted", "[tuning][pure]") {
  // Catches: a bracket short of trials waiting forever (the experiment would never end).
  auto h = hyperband_9_3({"t0", "t1"});  // bracket 0 wants 3
  CHECK(h.on_trial_result("t0", at(9, "score", 1)).what == hold);
  CHECK(h.on_trial_result("t1", at(9, "score", 2)).what == hold);  // a third trial may still join
  CHECK(h.take_paused_decisions().stop.empty());
  h.on_no_more_trials();
  CHECK(h.take_paused_decisions().stop == std::vector<std::string>{"t0", "t1"});
}

TEST_CASE("HyperBand's state round-trips: a restored scheduler decides as the original would", "[tuning][pure]") {
  // Catches: live trials, milestones or stage lost in save_state, so a resumed experiment halves
  // at the wrong point or forgets paused trials.
  auto h = hyperband_9_3(trials_named(0, 7));
  double const score[] = {0, 0, 0, 0.1, 0.5, 0.3, 0.9, 0.2};
  for (int i = 3; i <= 6; ++i) CHECK(h.on_trial_result("t" + std::to_string(i), at(3, "score", score[i])).what == hold);
  auto saved = json::parse(h.save_state().dump());
  schedule::hyperband r{.max_t = 9, .reduction_factor = 3};
  r.setup({"score", cohort::order::max});
  r.restore_state(saved);
  CHECK(r.brackets() == h.brackets());
  CHECK(r.on_trial_result("t7", at(3, "score", score[7])).what == halt);
  CHECK(r.take_paused_decisions().resume == std::vector<std::string>{"t4", "t6"});
  schedule::hyperband other{.max_t = 3, .reduction_factor = 3};
  other.setup({"score", cohort::order::max});
  CHECK_THROWS_WITH(other.restore_state(saved), contains_text("restore with the knobs it was saved with"));
}
