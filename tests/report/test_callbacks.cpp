#include <cohort/report/best_checkpoint.hpp>
#include <cohort/report/callbacks.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../callback_log.hpp"
#include "../catch.hpp"
#include "../support.hpp"

namespace {

/// Only results; throws on each.
struct thrower {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  void on_trial_result(cohort::report::trial_info const&, nlohmann::json const&) {
    ++*calls;
    throw std::runtime_error("tracker refused");
  }
};

/// Blocks in its first result until released.
struct blocker {
  std::shared_ptr<std::atomic<bool>> release = std::make_shared<std::atomic<bool>>(false);
  void on_trial_result(cohort::report::trial_info const&, nlohmann::json const&) {
    while (!*release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

}  // namespace

TEST_CASE("callbacks: the concept takes any type with one of Ray's events, and nothing else", "[report][pure]") {
  STATIC_REQUIRE(cohort::callback<cohort_test::event_log>);
  STATIC_REQUIRE(cohort::callback<thrower>);
  STATIC_REQUIRE(!cohort::callback<int>);
  struct unrelated {
    void on_something(int) {}
  };
  STATIC_REQUIRE(!cohort::callback<unrelated>);
}

TEST_CASE("callbacks: every event reaches each callback in order, on the runner's thread", "[report][pure]") {
  // Catches: events lost or reordered, a restore told as a plain start, a result told without
  // its trial's config, the end told before the last result.
  cohort_test::event_log r;
  thrower t;
  cohort_test::capture_stderr err;
  {
    auto runner = cohort::report::make_callback_runner(std::tuple{r, t});
    REQUIRE(runner);
    cohort::report::experiment_info const info{.name = "exp"};
    runner->experiment_start(info);
    runner->trial_start({.id = "t0", .config = {{"lr", 0.1}}});
    runner->trial_start({.id = "t1", .config = {{"lr", 0.2}}}, "/x/checkpoint_000002");
    runner->trial_result("t0", {{"training_iteration", 1}});
    runner->checkpoint("t0", "/x/t0/checkpoint_000001");
    runner->trial_result("t1", {{"training_iteration", 2}});
    runner->trial_error("t1", "boom");
    runner->trial_complete("t0");
    runner->finish(&info);
    CHECK(runner->dropped() == 0);
  }
  CHECK(*r.log == std::vector<std::string>{"start exp", "trial t0 {\"lr\":0.1}", "restore t1 checkpoint_000002", "result t0 1",
                                           "checkpoint t0 checkpoint_000001", "result t1 2", "error t1: boom", "complete t0",
                                           "end exp"});
  CHECK(*t.calls == 2);  // a callback that throws keeps getting events, and is said once
  auto const said = err.text();
  CHECK_THAT(said, contains_text("callback 1 threw in on_trial_result: tracker refused; training goes on"));
  CHECK(said.find("threw") == said.rfind("threw"));
  CHECK(cohort::report::make_callback_runner(std::tuple<>{}) == nullptr);
}

TEST_CASE("callbacks: one that blocks never holds up the poster; the queue is bounded and the drops said", "[report][pure]") {
  // Catches: posting waiting for the callback (training stalls), an unbounded queue, an end that
  // waits forever for a blocked callback, drops not said.
  blocker b;
  cohort_test::capture_stderr err;
  auto runner = cohort::report::make_callback_runner(
      // No slow-call line: the thread left blocked must write nothing once the test has read stderr.
      std::tuple{b}, {.max_queued_events = 100, .slow_call = std::chrono::hours(1), .drain_timeout = std::chrono::milliseconds(300)});
  auto const start = std::chrono::steady_clock::now();
  runner->trial_start({.id = "t0"});
  for (int i = 0; i < 1000; ++i) runner->trial_result("t0", {{"loss", i}});
  auto const posting = std::chrono::steady_clock::now() - start;
  // 1,000 posts: a poster that waited for the blocked callback would never get here. The bounds
  // only tell "never" from a slow machine (the sanitizer builds at 3 ranks on 2 cores took 0.28 s).
  CHECK(posting < std::chrono::seconds(10));
  runner->finish();
  auto const ended = std::chrono::steady_clock::now() - start;
  CHECK(ended - posting < std::chrono::seconds(10));  // drain_timeout is 0.3 s: an end that waited for the callback never comes
  CHECK(runner->dropped() >= 800);  // at most 100 wait, one is being delivered
  auto const said = err.text();
  CHECK_THAT(said, contains_text("callbacks still busy"));
  CHECK_THAT(said, contains_text("events dropped (more than 100 were waiting)"));
  *b.release = true;  // the detached thread finishes on its own
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

TEST_CASE("callbacks: a trial's best checkpoint by the metric, not the newest", "[report][pure]") {
  using cohort::report::detail::best_checkpoint;
  auto row = [](std::int64_t i, double loss) { return nlohmann::json{{"training_iteration", i}, {"val", {{"loss", loss}}}}; };
  SECTION("min over an \"a/b\" path: checkpoints 2 (0.5), 4 (0.3), 6 (0.4): 2 and 4 are each the best when told, 6 not") {
    best_checkpoint b{.metric = "val/loss", .mode = cohort::min};
    for (auto [i, loss] : {std::pair{1, 0.9}, {2, 0.5}, {3, 0.4}, {4, 0.3}, {5, 0.2}, {6, 0.4}}) b.observe(row(i, loss));
    CHECK(b.is_new_best(2));
    CHECK(b.is_new_best(4));
    CHECK_FALSE(b.is_new_best(6));
    CHECK(b.values.empty());  // every value up to the last checkpoint matched and dropped
  }
  SECTION("max; a tie keeps the earlier checkpoint; async checkpoints told after later results") {
    best_checkpoint b{.metric = "val/loss", .mode = cohort::max};
    b.observe(row(1, 0.7));
    b.observe(row(2, 0.7));
    b.observe(row(3, 0.9));
    CHECK(b.is_new_best(1));
    CHECK_FALSE(b.is_new_best(2));
    CHECK(b.is_new_best(3));
  }
  SECTION("no metric: every checkpoint is the newest, so the best") {
    best_checkpoint b{};
    b.observe(row(1, 0.1));
    CHECK(b.is_new_best(1));
    CHECK(b.is_new_best(2));
  }
  SECTION("a checkpoint whose result lacks the metric counts only until one has it") {
    best_checkpoint b{.metric = "acc", .mode = cohort::max};
    b.observe(nlohmann::json{{"training_iteration", 1}});
    CHECK(b.is_new_best(1));
    b.observe(nlohmann::json{{"training_iteration", 2}, {"acc", 0.5}});
    CHECK(b.is_new_best(2));
    b.observe(nlohmann::json{{"training_iteration", 3}});
    CHECK_FALSE(b.is_new_best(3));
  }
}
