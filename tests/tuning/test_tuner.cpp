// The tuner inside the MPI job, at every rank count of the core tests: trials split across groups
// of ranks_per_trial, schedulers and stoppers acting on the results, the experiment's files.
#include <cohort/tuning/tuner.hpp>

#include <cohort/scaling/cuda.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "../callback_log.hpp"
#include "../catch.hpp"
#include "../support.hpp"

namespace {

using cohort_test::world_rank;
using cohort_test::world_size;

std::size_t line_count(std::filesystem::path const& p) {
  std::ifstream in(p);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

/// A trial: `iterations` reports of score = -(x - 2)^2 - (y - 1)^2 (best at x = 2, y = 1), each
/// with the world rank that ran it, the GPU scaling::cuda would give it, and wall-clock times
/// (trial start, this report), so the test can see the groups.
/// With `rendezvous` set, a trial first leaves a file there named after its world rank and waits
/// (at most 60 s) until `groups` such files exist: every group then holds a trial at once, however
/// the machine schedules them (an event, where a timing would let a busy group miss every trial).
struct quadratic {
  int iterations = 3;
  int sleep_ms = 5;
  std::filesystem::path rendezvous{};
  int groups = 0;
  void operator()(cohort::context& ctx, nlohmann::json const& config) const {
    if (!rendezvous.empty()) {
      std::ofstream(rendezvous / ("rank_" + std::to_string(world_rank())));
      auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      auto arrived = [&] {
        return std::distance(std::filesystem::directory_iterator(rendezvous), std::filesystem::directory_iterator{});
      };
      while (arrived() < groups && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    double const x = config.at("x").get<double>(), y = config.at("y").get<double>();
    auto const start = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (int i = 1; i <= iterations; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      ctx.report({{"score", -(x - 2) * (x - 2) - (y - 1) * (y - 1) + 0.01 * i},
                  {"rank", world_rank()},
                  {"group_size", ctx.world_size()},
                  {"gpu", cohort::scaling::cuda{}.device_for(ctx.topology()).str()},
                  {"start", start},
                  {"now", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}});
    }
  }
};

/// Whether the job has an even rank count, as `groups` need; else the case says why it does
/// nothing here (it runs at 2 and 4 ranks).
bool even_rank_count(std::string const& groups) {
  if (world_size() % 2 == 0) return true;
  SUCCEED(groups + " need an even rank count (the case runs at 2 and 4 ranks)");
  return false;
}

}  // namespace

TEST_CASE("a grid search runs every trial once, spread over the groups", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_grid");
  auto const rendezvous = storage / "rendezvous";
  if (world_rank() == 0) std::filesystem::create_directories(rendezvous);
  MPI_Barrier(MPI_COMM_WORLD);
  cohort::tuner tuner{quadratic{.rendezvous = rendezvous, .groups = world_size()},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .num_samples = 2, .status_interval_s = 1e9}};
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
  CHECK(leaders.size() == static_cast<std::size_t>(world_size()));  // every group ran trials (the rendezvous)
  auto const& best = grid.best_result();
  CHECK(best.config.at("x") == 2.0);
  CHECK(best.config.at("y") == 1.0);
  if (world_rank() == 0) {
    auto exp = storage / "grid";
    CHECK(line_count(exp / "trials.csv") == 19);
    std::ifstream html(exp / "report.html");
    std::string const page{std::istreambuf_iterator<char>(html), std::istreambuf_iterator<char>()};
    auto count = [&](std::string const& what) {
      std::size_t n = 0;
      for (auto at = page.find(what); at != std::string::npos; at = page.find(what, at + 1)) ++n;
      return n;
    };
    CHECK(count("<tr") == 19);  // report.html: the header and a row per trial, the 18th in the 8th colour
    CHECK(count("<tr class=\"best\">") == 1);
    CHECK(page.find("background:#7f7f7f\"></span>trial_00017</td>") != std::string::npos);
    // The configs against score, then score, start, now (rank and group_size: integers that never
    // decrease, left out as counters; gpu is text).
    CHECK(count("<svg") == 4);
    CHECK(page.find("aria-label=\"parallel coordinates\"") != std::string::npos);
    CHECK(page.find("aria-label=\"score\"") != std::string::npos);
    CHECK(std::filesystem::exists(exp / "experiment_state.json"));
    CHECK(line_count(exp / "trial_00017" / "result.json") == 3);
    CHECK(std::filesystem::exists(exp / "trial_00017" / "params.json"));
  }
}

TEST_CASE("as many trials as groups: every group runs one, none reserved ahead for a group already busy", "[tuning][mpi]") {
  // Catches: a group that asks ahead as its first trial starts getting the next trial reserved
  // before another group has asked for any (that group would sit idle: here each trial waits,
  // up to 60 s, for every group to hold one).
  auto const storage = cohort_test::scratch("tune_one_each");
  auto const rendezvous = storage / "rendezvous";
  if (world_rank() == 0) std::filesystem::create_directories(rendezvous);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<nlohmann::json> xs;
  for (int i = 0; i < world_size(); ++i) xs.push_back(double(i));
  cohort::tuner tuner{quadratic{.iterations = 1, .sleep_ms = 1, .rendezvous = rendezvous, .groups = world_size()},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search(xs)}, {"y", 0.0}},
                        {.name = "one_each", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == static_cast<std::size_t>(world_size()));
  std::set<int> leaders;
  for (auto const& t : grid.trials) leaders.insert(t.metrics.at("rank").get<int>());
  CHECK(leaders.size() == static_cast<std::size_t>(world_size()));
}

TEST_CASE("short trials, each group's next two reserved ahead: every trial runs once and none is left pending", "[tuning][mpi]") {
  // Catches: a group told "done" while a trial reserved for it has not started (the coordinator
  // would stop serving, and the trial stay PENDING), an answer lost or given twice when a group
  // has two requests unanswered, and a reserved trial run by two groups.
  for (int round = 0; round < 3; ++round) {
    auto const storage = cohort_test::scratch("tune_ahead_" + std::to_string(round));
    cohort::tuner tuner{quadratic{.iterations = 1, .sleep_ms = 0},
                        cohort::tune_config{.metric = "score", .mode = cohort::max, .num_samples = 120,
                                            .status_interval_s = 1e9}};
    auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0.0, 4.0)}, {"y", 1.0}},
                          {.name = "ahead", .storage_path = storage.string(), .verbose = 0});
    REQUIRE(grid.ok());
    REQUIRE(grid.size() == 120);
    std::set<std::string> ids;
    for (auto const& t : grid.trials) {
      CHECK(t.status == "TERMINATED");
      CHECK(t.metrics_history.size() == 1);
      ids.insert(t.id);
    }
    CHECK(ids.size() == 120);
    if (world_rank() == 0) {
      std::ifstream in(storage / "ahead" / "experiment_state.json");
      auto const state = nlohmann::json::parse(in);
      std::size_t terminated = 0;
      for (auto const& t : state.at("trials")) terminated += t.at("status") == "TERMINATED";
      CHECK(terminated == 120);
      CHECK(line_count(storage / "ahead" / "trials.csv") == 121);
    }
  }
}

TEST_CASE("a functor's returned JSON object is its trial's final result, as in Ray Tune", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_return");
  // One report along the way, then the final figures returned (Ray's `return {"acc": acc}`).
  auto trainable = [](cohort::context& ctx, nlohmann::json const& config) {
    double const x = config.at("x").get<double>();
    ctx.report({{"score", -100.0}});
    return nlohmann::json{{"score", -(x - 2) * (x - 2)}, {"returned", true}};
  };
  cohort::tuner tuner{trainable, cohort::tune_config{.metric = "score", .mode = cohort::max, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({1.0, 2.0, 4.0})}},
                        {.name = "returned", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 3);
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    REQUIRE(t.metrics_history.size() == 2);  // the report, then the returned object
    CHECK(t.metrics.value("returned", false));
    CHECK(t.metrics.at("training_iteration") == 2);
  }
  // The searcher ranks by the returned score (the reported -100 would tie every trial).
  CHECK(grid.best_result().config.at("x") == 2.0);
  if (world_rank() == 0) CHECK(line_count(storage / "returned" / grid.best_result().id / "result.json") == 2);
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
    // Trials side by side on one node get GPUs of their own: the leader's index among the job's
    // ranks on the node (its world rank here), not its rank in its group (0 for every leader).
    CHECK(t.metrics.at("gpu") == "cuda:" + std::to_string(t.metrics.at("rank").get<int>()));
    spans.push_back({t.metrics_history.front().at("start").get<double>(), t.metrics.at("now").get<double>()});
  }
  int most = 0;
  for (auto const& [s, e] : spans) {
    int overlapping = 0;
    for (auto const& [s2, e2] : spans) overlapping += (s2 <= s && s < e2) ? 1 : 0;
    most = std::max(most, overlapping);
  }
  CHECK(most <= n / per);
}

TEST_CASE("max_concurrent_trials = 1 runs one trial at a time however many groups there are", "[tuning][mpi]") {
  // Catches: tune_config.max_concurrent_trials ignored (every group would take a trial at once:
  // at 2-4 ranks the 4 trials of 2 x 30 ms would overlap), or a limit that stalls the experiment.
  auto const storage = cohort_test::scratch("tune_max_concurrent");
  cohort::tuner tuner{quadratic{.iterations = 2, .sleep_ms = 30},
                      cohort::tune_config{.metric = "score", .num_samples = 4, .max_concurrent_trials = 1, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 4)}, {"y", 1.0}},
                        {.name = "one_at_a_time", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 4);
  std::vector<std::pair<double, double>> spans;
  for (auto const& t : grid.trials)
    spans.push_back({t.metrics_history.front().at("start").get<double>(), t.metrics.at("now").get<double>()});
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) CHECK(spans[i].first >= spans[i - 1].second);  // began after the last ended
}

TEST_CASE("validator ranks under a tuner: each trial group's last rank validates that trial's checkpoints", "[tuning][mpi][validation]") {
  // Catches: validators shared across trial groups (a checkpoint validated by another trial's
  // rank, or never), and a trial's validators left waiting when its trial ends.
  if (!even_rank_count("groups of 2 (a trainer and a validator)")) return;
  auto const storage = cohort_test::scratch("tune_validators");
  auto trainable = [](cohort::context& ctx, nlohmann::json const& config) {
    int const x = static_cast<int>(config.at("x").get<double>());
    for (int i = 1; i <= 2; ++i)
      ctx.report({{"score", x * i}, {"trainers", ctx.world_size()}},
                 cohort::checkpoint_payload{[x, i](std::filesystem::path const& dir, int) { std::ofstream(dir / "value") << x * i; }});
  };
  cohort::tuner tuner{trainable, cohort::tune_config{.metric = "score", .mode = cohort::max, .ranks_per_trial = 2, .status_interval_s = 1e9}};
  cohort::run_config run{.name = "validated", .storage_path = storage.string(), .verbose = 0};
  run.validators = {.ranks = 1, .validate = [](cohort::checkpoint const& c, cohort::validator_context&) {
                      int value = 0;
                      std::ifstream(c.path() / "value") >> value;
                      return nlohmann::json{{"val", value * 10}, {"validator", world_rank()}};
                    }};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({1.0, 2.0, 3.0})}}, run);
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 3);
  CHECK(grid.best_result().config.at("x") == 3.0);
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    CHECK(t.metrics.at("trainers") == 1);  // the trial's functor ran on its group's first rank only
    if (world_rank() != 0) continue;
    int const x = static_cast<int>(t.config.at("x").get<double>());
    for (int i = 1; i <= 2; ++i) {
      std::ifstream in(t.path / cohort::checkpointing::dir_name(i) / "validation.json");
      REQUIRE(in);
      auto const v = nlohmann::json::parse(in);
      CHECK(v.at("val") == x * i * 10);
      CHECK(v.at("validator").get<int>() % 2 == 1);  // the second rank of some group
    }
  }
  for (auto const& t : grid.trials) {  // every rank: the trial results carry their checkpoints
    REQUIRE(t.checkpoints.size() == 2);
    REQUIRE(t.checkpoint().has_value());
    CHECK(t.checkpoint()->path == t.path / cohort::checkpointing::dir_name(2));
    CHECK(t.checkpoint()->metrics.at("score") == 2 * t.config.at("x").get<double>());
    auto const lowest = t.best_checkpoint({.metric = "score", .mode = cohort::min});
    REQUIRE(lowest.has_value());
    CHECK(lowest->path == t.path / cohort::checkpointing::dir_name(1));
    CHECK_FALSE(t.best_checkpoint({.metric = "absent"}).has_value());
  }
}

TEST_CASE("validator ranks that leave a trial no rank to train: one error on every rank before any trial", "[tuning][mpi][validation][bad-input]") {
  // Catches: the check left to each trial (every trial failing in turn on a count of its group's
  // ranks that does not name ranks_per_trial), or missing (a group whose every rank validates,
  // waiting for checkpoints no trainer sends).
  auto const storage = cohort_test::scratch("tune_validators_only");
  cohort::tuner tuner{quadratic{.iterations = 1, .sleep_ms = 0},
                      cohort::tune_config{.metric = "score", .num_samples = 2, .status_interval_s = 1e9}};
  cohort::run_config run{.name = "no_trainer", .storage_path = storage.string(), .verbose = 0};
  run.validators = {.ranks = 1, .validate = [](cohort::checkpoint const&, cohort::validator_context&) { return nlohmann::json::object(); }};
  auto grid = tuner.fit(cohort::space{{"x", 1.0}, {"y", 1.0}}, run);
  REQUIRE_FALSE(grid.ok());
  CHECK_THAT(*grid.error, contains_text("each trial's group of tune_config.ranks_per_trial = 1 ranks: "
                                        "run_config.validators.ranks = 1 with 1 ranks: give between 0 and 0"));
  CHECK(grid.size() == 0);
  CHECK_FALSE(std::filesystem::exists(storage / "no_trainer"));  // no trial started, no experiment directory
}

namespace {

/// A scheduler that says every result will be answered proceed (as fifo does), then fails on
/// each trial's third: a result its group sends without waiting (the assignment, or the answer
/// to the first result, names the span, and the next come within quiet_results::max_quiet).
struct fails_at_3 {
  void setup(cohort::tuning::objective const&) {}
  void on_trial_add(std::string const&, nlohmann::json const&) {}
  cohort::tuning::scheduling_decision on_trial_result(std::string const&, nlohmann::json const& row) {
    if (row.at("training_iteration") == 3) throw cohort::error("no decision at 3");
    return {};
  }
  cohort::tuning::proceed_span proceeds(std::string const&) const { return {}; }
  void on_trial_complete(std::string const&, nlohmann::json const&) {}
  nlohmann::json save_state() const { return nlohmann::json::object(); }
  void restore_state(nlohmann::json const&) {}
};

}  // namespace

TEST_CASE("a decision on a result its group did not wait for reaches the trial at its next report that waits", "[tuning][mpi]") {
  // Every group's results go to rank 0's coordinator without waiting for the answer (the
  // scheduler says proceed is sure); its failure on the third is owed to the trial and answered
  // at the trial's next result that waits, at most quiet_results::max_quiet later.
  // Catches: the owed decision dropped, or results that never wait again (the trials would run
  // all 200,000 reports and end TERMINATED).
  auto const storage = cohort_test::scratch("tune_quiet");
  constexpr int most = 200000;
  auto fn = [](cohort::context& ctx, nlohmann::json const&) {
    for (int i = 0; i < most; ++i) ctx.report({{"score", i}});
  };
  std::vector<nlohmann::json> xs;
  for (int g = 0; g < world_size(); ++g) xs.emplace_back(g);
  cohort::tuner tuner{fn, fails_at_3{}, cohort::tune_config{.metric = "score", .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search(xs)}}, {.name = "quiet", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == static_cast<std::size_t>(world_size()));
  for (auto const& t : grid.trials) {
    CHECK(t.status == "ERROR");
    CHECK_THAT(t.error.value_or(""), contains_text("no decision at 3"));
    CHECK(t.metrics_history.size() >= 3);
    CHECK(t.metrics_history.size() < static_cast<std::size_t>(most));
  }
}

namespace {

/// A scheduler whose proceeds() throws (a user's scheduler with a bug in its promise): asked as a
/// trial is handed out, reserved ahead for a busy group (it says the next trial does not wait for
/// completions, as fifo), and after each result answered proceed.
struct promise_throws {
  static constexpr bool next_independent_of_completions = true;
  void setup(cohort::tuning::objective const&) {}
  void on_trial_add(std::string const&, nlohmann::json const&) {}
  cohort::tuning::scheduling_decision on_trial_result(std::string const&, nlohmann::json const&) { return {}; }
  cohort::tuning::proceed_span proceeds(std::string const&) const { throw cohort::error("no span here"); }
  void on_trial_complete(std::string const&, nlohmann::json const&) {}
  nlohmann::json save_state() const { return nlohmann::json::object(); }
  void restore_state(nlohmann::json const&) {}
};

}  // namespace

TEST_CASE("a scheduler whose proceeds() throws fails the experiment with the cause on every rank, without a hang", "[tuning][mpi]") {
  // Catches: the exception escaping the coordinator's answer to a group's request, which left
  // that group waiting for an answer that never came.
  auto const storage = cohort_test::scratch("tune_promise_throws");
  auto fn = [](cohort::context& ctx, nlohmann::json const&) {
    for (int i = 0; i < 3; ++i) ctx.report({{"score", i}});
  };
  std::vector<nlohmann::json> xs;
  for (int g = 0; g < 4 * world_size(); ++g) xs.emplace_back(g);
  cohort::tuner tuner{fn, promise_throws{}, cohort::tune_config{.metric = "score", .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search(xs)}},
                        {.name = "promise", .storage_path = storage.string(), .verbose = 0, .collective_timeout_ms = 60000});
  REQUIRE_FALSE(grid.ok());
  CHECK_THAT(*grid.error, contains_text("the scheduler failed: no span here"));
  CHECK(grid.size() < xs.size());  // the experiment stopped: not every trial was started
}

TEST_CASE("results sent without waiting reach the coordinator in order, batched or one by one", "[tuning][mpi]") {
  // Each trial reports in bursts (batched), each but the last followed by a pause past max_quiet
  // (the next result waits for its answer) and a row with keys of its own; the trial ends in a
  // burst. Catches: a batch's rows lost, reordered or given to another trial, rows still waiting
  // when a result that waits is sent or when the trial ends left behind, a row given the keys of
  // the rows before it.
  auto const storage = cohort_test::scratch("tune_batches");
  constexpr int bursts = 3, per_burst = 700;
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) {
    int i = 0;
    for (int b = 0; b < bursts; ++b) {
      for (int k = 0; k < per_burst; ++k, ++i) ctx.report({{"i", i}, {"x", config.at("x")}});
      if (b + 1 == bursts) break;
      std::this_thread::sleep_for(cohort::tuning::detail::quiet_results::max_quiet + std::chrono::milliseconds(5));
      ctx.report({{"i", i++}, {"x", config.at("x")}, {"after_pause", true}});
    }
  };
  std::vector<nlohmann::json> xs;
  for (int g = 0; g < 2 * world_size(); ++g) xs.emplace_back(g);
  cohort::tuner tuner{fn, cohort::tune_config{.metric = "i", .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search(xs)}}, {.name = "batches", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == xs.size());
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    REQUIRE(t.metrics_history.size() == bursts * (per_burst + 1) - 1);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < t.metrics_history.size(); ++i) {
      auto const& row = t.metrics_history[i];
      wrong += row.at("i") != static_cast<int>(i) || row.at("x") != t.config.at("x") || row.contains("after_pause") != ((i + 1) % (per_burst + 1) == 0);
    }
    CHECK(wrong == 0);
  }
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

TEST_CASE("best_result ranks trials by each scope: last, best of all, average of the last k", "[tuning][pure]") {
  auto trial = [](std::string id, std::vector<double> scores) {
    cohort::tuning::trial_result t;
    t.id = std::move(id);
    for (double s : scores) t.metrics_history.push_back({{"score", s}, {"other", 1}});
    return t;
  };
  cohort::tuning::result_grid grid;
  grid.trials = {trial("peaked", {1, 9, 2}),        // last 2, best 9, mean 4, mean of last 2: 5.5
                 trial("steady", {4, 4, 4}),        // 4 everywhere
                 trial("rising", {0, 1, 3}),        // last 3, best 3, mean 4/3, mean of last 2: 2
                 trial("late", {5, 7}),             // last 7, best 7, mean 6, mean of last 2: 6
                 trial("silent", {})};              // never reported the metric
  grid.trials.back().metrics_history.push_back({{"other", 100}});
  using cohort::tuning::scope;
  auto best = [&](scope sc, cohort::order mode, std::size_t k = 0) {
    return grid.best_result({.metric = "score", .mode = mode, .scope = sc, .last_k = k}).id;
  };
  CHECK(best(scope::last, cohort::max) == "late");
  CHECK(best(scope::last, cohort::min) == "peaked");
  CHECK(best(scope::all, cohort::max) == "peaked");
  CHECK(best(scope::all, cohort::min) == "rising");
  CHECK(best(scope::average_of_last, cohort::max) == "late");   // 6 > 4 = 4 > 4/3
  CHECK(best(scope::average_of_last, cohort::min) == "rising");
  CHECK(best(scope::average_of_last, cohort::max, 1) == "late");  // k = 1 is scope last
  CHECK(best(scope::average_of_last, cohort::min, 2) == "rising");  // 2 < 4 < 5.5 < 6
  grid.trials[3].metrics_history = {{{"score", 0}}, {{"score", 5}}, {{"score", 6}}};  // late: last 2 average 5.5, ties peaked
  CHECK(best(scope::average_of_last, cohort::max, 2) == "peaked");  // ties: the first trial keeps it
  CHECK(grid.trials[4].score({.metric = "score"}) != grid.trials[4].score({.metric = "score"}));  // NaN: never wins
  CHECK_THROWS_WITH(grid.best_result({.metric = "absent"}), contains_text("no trial reported the metric 'absent'"));
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

TEST_CASE("a trial group's communicators serve the next trial only after a trial that ended cleanly", "[tuning][mpi]") {
  // Catches: a group's communicators kept after a failed trial. The failing trial's root sends
  // into a broadcast its other rank never enters; the next trial's broadcast on the same
  // communicator would receive that stale value (100 + 1) instead of its own, and fail.
  if (!even_rank_count("groups of 2")) return;
  auto const storage = cohort_test::scratch("tune_comms_reused");
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) {
    int const x = config.at("x").get<int>();
    if (x == 1 && ctx.world_rank() == 1) throw std::runtime_error("x = 1 fails on rank 1 before the broadcast");
    std::int64_t value = ctx.world_rank() == 0 ? 100 + x : -1;
    ctx.comm().broadcast(reinterpret_cast<std::byte*>(&value), sizeof value, 0);
    if (value != 100 + x) throw std::runtime_error("received " + std::to_string(value) + ": another trial's broadcast");
    ctx.report({{"score", x}, {"received", value}});
    ctx.report({{"score", x}, {"received", value}});
  };
  cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .ranks_per_trial = 2, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({0, 1, 2, 3, 4, 5})}},
                        {.name = "reused", .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 5000});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 6);
  CHECK(grid.num_errors() == 1);
  for (auto const& t : grid.trials) {
    int const x = t.config.at("x").get<int>();
    if (x == 1) {
      CHECK(t.status == "ERROR");
      continue;
    }
    CHECK(t.status == "TERMINATED");
    CHECK(t.metrics.at("received") == 100 + x);
    CHECK(t.metrics_history.size() == 2);
  }
}

namespace {

/// A trial of 5 reports (score = x * step), those of even steps with a checkpoint holding the step,
/// resumed from ctx.checkpoint(). Each attempt appends the step it starts after to
/// `log`/attempts_<x>; the trial with x == `failing` throws right after its report of step 3 on
/// its first attempt and of step 5 on its second (each after its last checkpoint).
struct flaky {
  std::filesystem::path log;
  int failing = -1;
  void operator()(cohort::context& ctx, nlohmann::json const& config) const {
    int const x = config.at("x").get<int>();
    int start = 0;
    if (ctx.checkpoint()) std::ifstream(ctx.checkpoint()->path() / "step") >> start;
    auto const attempts_file = log / ("attempts_" + std::to_string(x));
    auto const attempt = line_count(attempts_file) + 1;
    std::ofstream(attempts_file, std::ios::app) << start << "\n";
    for (int i = start + 1; i <= 5; ++i) {
      if (i % 2 == 0)
        ctx.report({{"score", x * i}}, cohort::checkpoint_payload{[i](std::filesystem::path const& dir, int) { std::ofstream(dir / "step") << i; }});
      else
        ctx.report({{"score", x * i}});
      if (x == failing && ((attempt == 1 && i == 3) || (attempt == 2 && i == 5)))
        throw std::runtime_error("flaky failure " + std::to_string(attempt));
    }
  }
};

/// The trials' (config x, each result's training_iteration and score), in trial order.
std::vector<std::vector<std::pair<int, int>>> runs_of(cohort::tuning::result_grid const& grid) {
  std::vector<std::vector<std::pair<int, int>>> out;
  for (auto const& t : grid.trials) {
    out.emplace_back();
    for (auto const& row : t.metrics_history) out.back().emplace_back(row.at("training_iteration").get<int>(), row.at("score").get<int>());
  }
  return out;
}

}  // namespace

TEST_CASE("max_failures: a trial that throws runs again from its latest checkpoint, then ERROR past the limit", "[tuning][mpi]") {
  // Catches: no retry, a retry from scratch (attempts not starting at steps 2 and 4), rows of a
  // failed attempt left in the history (iterations 3 and 5 twice), failures not counted, a limit
  // off by one.
  auto const storage = cohort_test::scratch("tune_retries");
  auto fit = [&](std::string const& name, int failing, int max_failures) {
    auto const log = storage / (name + "_log");
    std::filesystem::create_directories(log);
    cohort::tuner tuner{flaky{log, failing}, cohort::tune_config{.metric = "score", .status_interval_s = 1e9, .max_failures = max_failures}};
    return std::pair{tuner.fit(cohort::space{{"x", cohort::grid_search({1, 2, 3})}},
                               {.name = name, .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 5000}),
                     log};
  };
  auto [unfailed, unfailed_log] = fit("unfailed", -1, 0);
  auto [retried, retried_log] = fit("retried", 2, 2);
  REQUIRE(unfailed.ok());
  REQUIRE(retried.ok());
  REQUIRE(retried.size() == 3);
  CHECK(retried.num_errors() == 0);
  CHECK(runs_of(retried) == runs_of(unfailed));  // the same results, each iteration once
  CHECK(retried.best_result().id == unfailed.best_result().id);
  CHECK(retried.trials[1].status == "TERMINATED");
  CHECK(retried.trials[1].num_failures == 2);
  CHECK(retried.trials[0].num_failures == 0);
  REQUIRE(retried.trials[1].checkpoint().has_value());
  CHECK(retried.trials[1].checkpoint()->path.filename() == cohort::checkpointing::dir_name(4));
  if (world_rank() == 0) {  // the attempts started after steps 0, 2 (checkpoint 2), 4 (checkpoint 4)
    std::ifstream in(retried_log / "attempts_2");
    std::string starts((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(starts == "0\n2\n4\n");
    std::ifstream csv(storage / "retried" / "trials.csv");
    std::string header;
    std::getline(csv, header);
    CHECK_THAT(header, contains_text("num_failures"));
    // Each result.json row carries the attempt that wrote it: the last row of each iteration
    // (a retry writes again the rows after its checkpoint) has 0 before the first failure, then 1, 2.
    std::ifstream result(storage / "retried" / cohort::tuning::detail::trial_id(1) / "result.json");
    std::map<int, int> failures_at;
    std::size_t rows = 0;
    for (std::string line; std::getline(result, line); ++rows) {
      auto const row = nlohmann::json::parse(line);
      REQUIRE(row.contains("num_failures"));
      failures_at[row.at("training_iteration").get<int>()] = row.at("num_failures").get<int>();
    }
    CHECK(rows == 7);  // 1-3, then 3-5 again, then 5 again
    CHECK(failures_at == std::map<int, int>{{1, 0}, {2, 0}, {3, 1}, {4, 1}, {5, 2}});
  }
  std::vector<std::pair<int, int>> history_failures;  // the grid's history: each iteration once
  for (auto const& row : retried.trials[1].metrics_history)
    history_failures.emplace_back(row.at("training_iteration").get<int>(), row.at("num_failures").get<int>());
  CHECK(history_failures == std::vector<std::pair<int, int>>{{1, 0}, {2, 0}, {3, 1}, {4, 1}, {5, 2}});

  auto [limited, limited_log] = fit("limited", 2, 1);  // a second failure is one too many
  REQUIRE(limited.ok());
  REQUIRE(limited.size() == 3);
  CHECK(limited.num_errors() == 1);
  CHECK(limited.trials[1].status == "ERROR");
  CHECK(limited.trials[1].num_failures == 2);
  CHECK_THAT(limited.trials[1].error.value_or(""), contains_text("flaky failure 2"));
  CHECK(limited.trials[2].status == "TERMINATED");
}

TEST_CASE("restore options: ERROR trials kept, resumed from their checkpoint or restarted; unfinished ones ended", "[tuning][mpi]") {
  // Catches: an option ignored, a resumed ERROR trial started over (or its old rows kept twice),
  // a restarted one resumed (or its directory deleted), an unfinished trial run though
  // resume_unfinished is false.
  auto const storage = cohort_test::scratch("tune_restore_options");
  auto fit = [&](std::string const& name, int failing, cohort::tune_config cfg) {
    auto const log = storage / (name + "_log");
    std::filesystem::create_directories(log);
    cfg.metric = "score";
    cfg.status_interval_s = 1e9;
    cohort::tuner tuner{flaky{log, failing}, cfg};
    return tuner.fit(cohort::space{{"x", cohort::grid_search({1, 2, 3})}},
                     {.name = name, .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 5000});
  };
  auto starts = [&](std::string const& name, int x) {
    std::ifstream in(storage / (name + "_log") / ("attempts_" + std::to_string(x)));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto iterations = [](cohort::tuning::trial_result const& t) {
    std::vector<int> out;
    for (auto const& row : t.metrics_history) out.push_back(row.at("training_iteration").get<int>());
    return out;
  };
  for (std::string name : {"kept", "resumed", "restarted"}) {
    auto first = fit(name, 2, {});
    REQUIRE(first.ok());
    REQUIRE(first.trials.at(1).status == "ERROR");  // after its report of step 3; checkpoint 2 committed
  }

  auto kept = fit("kept", -1, {});
  REQUIRE(kept.ok());
  CHECK(kept.trials.at(1).status == "ERROR");
  CHECK(kept.num_errors() == 1);
  if (world_rank() == 0) CHECK(starts("kept", 2) == "0\n");  // not run again

  auto resumed = fit("resumed", -1, {.resume_errored = true});
  REQUIRE(resumed.ok());
  CHECK(resumed.num_errors() == 0);
  CHECK(resumed.trials.at(1).status == "TERMINATED");
  CHECK(iterations(resumed.trials.at(1)) == std::vector<int>{1, 2, 3, 4, 5});  // step 3 once
  if (world_rank() == 0) CHECK(starts("resumed", 2) == "0\n2\n");  // from checkpoint 2

  auto restarted = fit("restarted", -1, {.restart_errored = true});
  REQUIRE(restarted.ok());
  CHECK(restarted.num_errors() == 0);
  CHECK(restarted.trials.at(1).status == "TERMINATED");
  CHECK(iterations(restarted.trials.at(1)) == std::vector<int>{1, 2, 3, 4, 5});
  if (world_rank() == 0) {
    CHECK(starts("restarted", 2) == "0\n0\n");  // from the start
    int aside = 0;  // the first attempt's directory, moved aside with its checkpoint
    for (auto const& e : std::filesystem::directory_iterator(storage / "restarted"))
      if (e.path().filename().string().starts_with("trial_00001.restarted_")) {
        ++aside;
        CHECK(std::filesystem::exists(e.path() / cohort::checkpointing::dir_name(2) / "step"));
      }
    CHECK(aside == 1);
  }

  // An unfinished trial (as a killed job leaves it: PENDING in experiment_state.json), restored
  // with resume_unfinished = false: it ends as it was.
  auto done = fit("unfinished", -1, {});
  REQUIRE(done.ok());
  if (world_rank() == 0) {
    auto const file = storage / "unfinished" / "experiment_state.json";
    std::ifstream in(file);
    auto state = nlohmann::json::parse(in);
    in.close();
    state["trials"][2]["status"] = "PENDING";
    std::ofstream(file) << state.dump();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto ended = fit("unfinished", -1, {.resume_unfinished = false});
  REQUIRE(ended.ok());
  CHECK(ended.trials.at(2).status == "TERMINATED");
  if (world_rank() == 0) CHECK(starts("unfinished", 3) == "0\n");  // not run again

  auto both = fit("both", -1, {.resume_errored = true, .restart_errored = true});
  CHECK_THAT(both.error.value_or(""), contains_text("resume_errored and restart_errored are both set: choose one"));
}

namespace {

/// The events of `trial` in `log` (cohort_test::event_log), in order ("result trial_00001 3" -> "result 3").
std::vector<std::string> events_of(std::vector<std::string> const& log, std::string const& trial) {
  std::vector<std::string> out;
  for (auto const& line : log) {
    auto const at = line.find(" " + trial);
    if (at != std::string::npos) out.push_back(line.substr(0, at) + line.substr(at + 1 + trial.size()));
  }
  return out;
}

}  // namespace

TEST_CASE("callbacks under the tuner: every trial's start, results, checkpoints, restore and end, in order", "[tuning][mpi]") {
  // Catches: events of other groups' trials missing (they reach rank 0 as messages), a retried
  // trial not told as restored from its checkpoint, checkpoints not told, the end told early.
  auto const storage = cohort_test::scratch("tune_callbacks");
  auto const attempts = storage / "attempts";
  std::filesystem::create_directories(attempts);
  cohort_test::event_log events;
  cohort::tuner tuner{flaky{attempts, 2}, events, cohort::tune_config{.metric = "score", .status_interval_s = 1e9, .max_failures = 1}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({1, 2, 3})}},
                        {.name = "callbacks", .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 5000});
  REQUIRE(grid.ok());
  CHECK(grid.num_errors() == 1);
  if (world_rank() != 0) {
    CHECK(events.log->empty());  // callbacks run on rank 0 only
    return;
  }
  auto const& log = *events.log;
  REQUIRE(log.size() > 2);
  CHECK(log.front() == "start callbacks (tuning)");
  CHECK(log.back() == "end callbacks");
  std::vector<std::string> const clean = {"trial {\"x\":1}", "result 1", "result 2", "checkpoint checkpoint_000002", "result 3",
                                          "result 4", "checkpoint checkpoint_000004", "result 5", "complete"};
  CHECK(events_of(log, "trial_00000") == clean);
  auto three = clean;
  three[0] = "trial {\"x\":3}";
  CHECK(events_of(log, "trial_00002") == three);
  // x = 2 throws after its third result, goes on from checkpoint 2, throws again after its fifth.
  auto failed = events_of(log, "trial_00001");
  REQUIRE(!failed.empty());
  CHECK_THAT(failed.back(), contains_text("error: flaky failure 2"));
  failed.pop_back();
  CHECK(failed == std::vector<std::string>{"trial {\"x\":2}", "result 1", "result 2", "checkpoint checkpoint_000002", "result 3",
                                           "restore checkpoint_000002", "result 3", "result 4", "checkpoint checkpoint_000004",
                                           "result 5"});
}

namespace {

/// trials.csv of experiment `dir` without what differs between runs (times, trial directories).
std::string stable_trials_csv(std::filesystem::path const& dir) {
  std::ifstream in(dir / "trials.csv");
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    rows.emplace_back();
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) rows.back().push_back(cell);
  }
  std::string out;
  if (rows.empty()) return out;
  for (auto const& row : rows) {
    for (std::size_t i = 0; i < row.size() && i < rows[0].size(); ++i) {
      auto const& column = rows[0][i];
      if (column == "time_this_iter_s" || column == "time_total_s" || column == "timestamp" || column == "logdir") continue;
      out += row[i] + ",";
    }
    out += "\n";
  }
  return out;
}

/// Runs `trainable` under `policies` with tune_config::reproducible (lag 3) over x, y in [0, 1],
/// at every divisor of the world size as ranks_per_trial (4 ranks: 4, 2 and 1 groups; experiment
/// <name>_<ranks_per_trial> under `storage`), and checks that each gives the same trials.csv (times
/// aside) and best config as the first. Returns the first trials.csv (rank 0; empty elsewhere).
template <class Trainable, class... Policies>
std::string same_at_every_group_count(std::filesystem::path const& storage, std::string const& name, std::size_t samples,
                                      Trainable trainable, Policies... policies) {
  cohort::space const space{{"x", cohort::uniform(0, 1)}, {"y", cohort::uniform(0, 1)}};
  std::optional<std::pair<std::string, nlohmann::json>> first;
  for (int per = world_size(); per >= 1; --per) {
    if (world_size() % per != 0) continue;
    auto const exp = name + "_" + std::to_string(per);
    cohort::tuner tuner{trainable, policies...,
                        cohort::tune_config{.metric = "loss", .mode = cohort::min, .num_samples = samples, .ranks_per_trial = per,
                                            .status_interval_s = 1e9, .reproducible = true, .reproducible_lag = 3}};
    auto grid = tuner.fit(space, {.name = exp, .storage_path = storage.string(), .verbose = 0});
    REQUIRE(grid.ok());
    std::pair got{world_rank() == 0 ? stable_trials_csv(storage / exp) : std::string{}, grid.best_result().config};
    INFO(name << " with " << world_size() / per << " groups");
    if (!first) {
      first = got;
      continue;
    }
    CHECK(got.first == first->first);
    CHECK(got.second == first->second);
  }
  return first ? first->first : std::string{};
}

/// Six reports of loss = q(config) (1 + 1 / t), each after a wait that depends on the rank and the
/// config, so that results arrive in another order at each group count.
void uneven(cohort::context& ctx, nlohmann::json const& config) {
  double const x = config.at("x").get<double>(), y = config.at("y").get<double>();
  double const q = (x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6);
  for (int t = 1; t <= 6; ++t) {
    std::this_thread::sleep_for(std::chrono::microseconds(300 + 1000 * ((world_rank() + t) % 3) + static_cast<int>(12000 * y)));
    ctx.report({{"loss", q * (1 + 1.0 / t)}});
  }
}

}  // namespace

TEST_CASE("reproducible: the same seed gives the same trials.csv at every group count (random + ASHA, TPE + FIFO)", "[tuning][mpi]") {
  // Catches: ASHA deciding on results in arrival order (a trial stopped at 2 groups, kept at 1),
  // TPE learning from whichever trials happened to end first. Groups: every divisor of the world
  // size as ranks_per_trial (4 ranks: 1, 2 and 4 groups).
  auto const storage = cohort_test::scratch("tune_reproducible");
  auto const asha = same_at_every_group_count(storage, "asha", 20, uneven, cohort::search::random{.seed = 11},
                                              cohort::schedule::asha{.max_t = 6, .grace_period = 1, .reduction_factor = 2});
  auto const tpe = same_at_every_group_count(storage, "tpe", 20, uneven, cohort::search::tpe{.seed = 11, .n_startup_trials = 5});
  if (world_rank() == 0) {
    CHECK(asha.size() > 200);  // 20 trials listed
    CHECK(tpe.size() > 200);
    CHECK(asha.find(",1,") != std::string::npos);  // ASHA stopped some trials early: decisions compared, not only configs
  }
}

namespace {

/// A class trainable for the pausing schedulers: loss = q(config) (1 + 1 / t) at step t, each
/// step after a wait that depends on the rank and the config (results arrive in another order at
/// each group count); its checkpoint (every step) holds its step count.
struct uneven_steps {
  double q = 0, y = 0;
  int steps = 0;
  void setup(nlohmann::json const& config) {
    double const x = config.at("x").get<double>();
    y = config.at("y").get<double>();
    q = (x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6);
  }
  nlohmann::json step() {
    ++steps;
    std::this_thread::sleep_for(std::chrono::microseconds(300 + 1000 * ((world_rank() + steps) % 3) + static_cast<int>(6000 * y)));
    return {{"loss", q * (1 + 1.0 / steps)}, {"done", steps >= 8}};
  }
  void save_checkpoint(std::filesystem::path const& dir) const { std::ofstream(dir / "state.json") << nlohmann::json{{"steps", steps}}.dump(); }
  void load_checkpoint(std::filesystem::path const& dir) {
    steps = nlohmann::json::parse(std::ifstream(dir / "state.json")).at("steps").get<int>();
  }
};

}  // namespace

TEST_CASE("reproducible: the same seed gives the same trials.csv at every group count (BOHB + HyperBand, synchronous PBT)", "[tuning][mpi]") {
  // Catches: BOHB learning from whichever milestones happened to be reached first, or waiting
  // for trials paused until later ones join their bracket (it would never end); PBT ranking
  // trials at different points, exploits decided in arrival order. Groups: every divisor of the
  // world size as ranks_per_trial.
  auto const storage = cohort_test::scratch("tune_reproducible_pausing");
  using cohort::schedule::hyperband;
  auto const bohb = same_at_every_group_count(storage, "bohb", 30, uneven_steps{}, cohort::search::bohb{.seed = 5, .min_points_in_model = 3},
                                             hyperband{.metric = "loss", .mode = cohort::min, .max_t = 9, .reduction_factor = 3,
                                                       .schedule = hyperband::brackets_of::bohb});
  same_at_every_group_count(storage, "pbt", 6, uneven_steps{}, cohort::search::random{.seed = 5},
                            cohort::schedule::pbt{.perturbation_interval = 2,
                                                  .hyperparam_mutations = {{"x", cohort::schedule::mutation::range{.low = 0, .high = 1}}},
                                                  .quantile_fraction = 0.34,
                                                  .seed = 5,
                                                  .synch = true});
  if (world_rank() == 0) {  // what was compared holds decisions: stops at milestones, exploits
    CHECK(std::count(bohb.begin(), bohb.end(), '\n') == 31);  // 30 trials listed
    std::size_t exploits = 0;
    for (auto const& e : std::filesystem::recursive_directory_iterator(storage / ("pbt_" + std::to_string(world_size()))))
      exploits += e.path().filename().string().rfind("exploit_", 0) == 0 ? 1 : 0;
    CHECK(exploits >= 3);  // three of six exploit at each of points 2, 4 and 6
  }
}

TEST_CASE("reproducible: schedulers it cannot cover are refused before any trial", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_reproducible_refused");
  cohort::space const space{{"x", cohort::uniform(0, 1)}, {"y", cohort::uniform(0, 1)}};
  cohort::tune_config const cfg{.metric = "loss", .mode = cohort::min, .num_samples = 2, .status_interval_s = 1e9, .reproducible = true};
  cohort::tuner median{uneven_steps{}, cohort::schedule::median_stopping{}, cfg};
  auto a = median.fit(space, {.name = "median", .storage_path = storage.string(), .verbose = 0});
  CHECK_THAT(a.error.value_or(""), contains_text("reproducible covers schedule::fifo, asha, hyperband and pbt{.synch = true}"));
  cohort::tuner async_pbt{uneven_steps{}, cohort::schedule::pbt{.hyperparam_mutations = {{"x", cohort::schedule::mutation::range{.low = 0, .high = 1}}}},
                          cfg};
  auto b = async_pbt.fit(space, {.name = "pbt", .storage_path = storage.string(), .verbose = 0});
  CHECK_THAT(b.error.value_or(""), contains_text("needs schedule::pbt{.synch = true}"));
  CHECK(a.size() == 0);
  CHECK(b.size() == 0);
}

namespace {

/// Waits (at most 60 s) until one of `files` exists: an event between trial groups, which a
/// timing on a busy machine could miss.
void wait_for_file(std::initializer_list<std::filesystem::path> files) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto any = [&] { return std::ranges::any_of(files, [](auto const& f) { return std::filesystem::exists(f); }); };
  while (!any() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

/// A class trainable for PBT: `score` grows by lr each step. Its checkpoint holds (steps, score);
/// the first step after loading one reports what it loaded, so the test can find the donor.
/// With `meeting` set (two or more groups), events order the trials so that an exploit must
/// happen: a fast trial (lr >= 0.5) marks "fast_at_2" once the tuner has its score at step 2 (its
/// perturbation point) and then, before step 4, waits until a slow trial has had its own step 2
/// decided ("slow_decided", or "exploited" when it loaded a checkpoint), so it is still running and
/// ahead when that happens; a slow trial waits for "fast_at_2" before its step 2.
struct climber {
  double lr = 0;
  int steps = 0;
  double score = 0;
  nlohmann::json loaded = nullptr;
  std::filesystem::path meeting{};

  void setup(nlohmann::json const& config) { lr = config.at("lr").get<double>(); }
  nlohmann::json step() {
    bool const fast = lr >= 0.5;
    if (!meeting.empty()) {
      // Each step() begins after the previous step's report came back with the tuner's decision.
      if (fast && steps == 2) std::ofstream(meeting / "fast_at_2");
      if (fast && steps == 3) wait_for_file({meeting / "slow_decided", meeting / "exploited"});
      if (!fast && steps == 1) wait_for_file({meeting / "fast_at_2"});
      if (!fast && steps == 2) std::ofstream(meeting / "slow_decided");
    }
    ++steps;
    score += lr;
    nlohmann::json r{{"score", score}, {"steps", steps}, {"lr", lr}, {"done", steps >= (fast ? 40 : 8)}};
    if (!loaded.is_null()) r["loaded"] = std::exchange(loaded, nullptr);
    return r;
  }
  void save_checkpoint(std::filesystem::path const& dir) const {
    std::ofstream(dir / "state.json") << nlohmann::json{{"steps", steps}, {"score", score}}.dump();
  }
  void load_checkpoint(std::filesystem::path const& dir) {
    loaded = nlohmann::json::parse(std::ifstream(dir / "state.json"));
    steps = loaded.at("steps").get<int>();
    score = loaded.at("score").get<double>();
    if (!meeting.empty()) std::ofstream(meeting / "exploited");
  }
};

}  // namespace

TEST_CASE("PBT restarts a bottom trial from a copy of a top trial's checkpoint with a perturbed config", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_pbt");
  // One group runs the trials one after another: nothing to order, and no trial to exploit.
  auto const meeting = storage / "meeting";
  if (world_size() >= 2 && world_rank() == 0) std::filesystem::create_directories(meeting);
  MPI_Barrier(MPI_COMM_WORLD);
  cohort::tuner tuner{climber{.meeting = world_size() >= 2 ? meeting : std::filesystem::path{}},
                      cohort::schedule::pbt{.perturbation_interval = 2,
                                            .hyperparam_mutations = {{"lr", cohort::schedule::mutation::range{.low = 0.01, .high = 10}}},
                                            .quantile_fraction = 0.5,
                                            .resample_probability = 0,
                                            .seed = 3},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"lr", cohort::grid_search({0.1, 1.0, 0.1, 1.0})}},
                        {.name = "pbt", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 4);
  int exploits = 0;
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    for (std::size_t i = 0; i < t.metrics_history.size(); ++i) {
      auto const& row = t.metrics_history[i];
      if (!row.contains("loaded")) continue;
      ++exploits;
      // The state it continued from is a checkpoint another trial committed: that trial reported
      // exactly this score at exactly this step.
      auto const steps = row["loaded"]["steps"].get<int>();
      auto const score = row["loaded"]["score"].get<double>();
      bool found = false;
      for (auto const& donor : grid.trials)
        for (auto const& d : donor.metrics_history)
          found = found || (donor.id != t.id && d.at("steps") == steps && d.at("score").get<double>() == score);
      CHECK(found);
      CHECK(row.at("steps") == steps + 1);
      CHECK(row.at("score").get<double>() == Approx(score + row.at("lr").get<double>()));
      // Perturbed by x1.2 or x0.8 from the donor's lr (0.1 or 1.0, or an earlier perturbation of them).
      CHECK((row.at("lr").get<double>() >= 0.01 && row.at("lr").get<double>() <= 10));
      if (world_rank() == 0) CHECK(std::filesystem::exists(t.path / "superseded"));
    }
  }
  // With two or more groups, a trial with lr 0.1 reaches step 2 behind a running trial with lr 1.0.
  if (world_size() >= 2) CHECK(exploits >= 1);
}

namespace {

/// A class trainable for HyperBand: its score is its config's "a" at every step, and its
/// checkpoint (every step) holds its step count, so a paused trial resumes where it was.
struct steady {
  double a = 0;
  int steps = 0;
  void setup(nlohmann::json const& config) { a = config.at("a").get<double>(); }
  nlohmann::json step() { return {{"score", a}, {"steps", ++steps}}; }
  void save_checkpoint(std::filesystem::path const& dir) const { std::ofstream(dir / "state.json") << nlohmann::json{{"steps", steps}}.dump(); }
  void load_checkpoint(std::filesystem::path const& dir) {
    steps = nlohmann::json::parse(std::ifstream(dir / "state.json")).at("steps").get<int>();
  }
};

}  // namespace

TEST_CASE("HyperBand through the tuner: trials pause at milestones, resume from their checkpoints, and the bracket's best reach max_t", "[tuning][mpi]") {
  // Catches: a paused trial never resumed or stopped (the experiment would not end), one that
  // restarts from step 1 instead of its checkpoint, or the wrong trials kept. max_t 9, eta 3:
  // bracket 0 runs the first three trials (a = 1, 2, 3) to 9; bracket 1 runs a = 4..8 to 3, then
  // the best two (a = 7, 8) to 9. Which trial lands in which bracket depends only on the order the
  // searcher suggests them, whatever the groups' timing.
  auto const storage = cohort_test::scratch("tune_hyperband");
  cohort::tuner tuner{steady{}, cohort::schedule::hyperband{.max_t = 9, .reduction_factor = 3},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"a", cohort::grid_search({1, 2, 3, 4, 5, 6, 7, 8})}},
                        {.name = "hyperband", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 8);
  for (auto const& t : grid.trials) {
    INFO(t.id << " a=" << t.config.dump());
    CHECK(t.status == "TERMINATED");
    auto const a = t.config.at("a").get<int>();
    std::size_t const expected = a >= 4 && a <= 6 ? 3 : 9;
    CHECK(t.metrics_history.size() == expected);
    for (std::size_t i = 0; i < t.metrics_history.size(); ++i) CHECK(t.metrics_history[i].at("steps") == i + 1);  // resumed, not restarted
  }
}

TEST_CASE("BOHB through the tuner: the paper's brackets, results observed at each milestone", "[tuning][mpi]") {
  // Catches: the searcher never told of paused trials (no observation below max_t), a bracket
  // schedule other than BOHB's. max_t 9, eta 3, one band of 15 trials: 9 run to 1, 3 go on to 3,
  // 1 to 9; 3 run to 3, 1 goes on to 9; 3 run to 9. So 6 trials end at 1, 4 at 3, 5 at 9.
  auto const storage = cohort_test::scratch("tune_bohb");
  using cohort::schedule::hyperband;
  cohort::tuner tuner{steady{}, cohort::search::bohb{.seed = 3},
                      hyperband{.max_t = 9, .reduction_factor = 3, .schedule = hyperband::brackets_of::bohb},
                      cohort::tune_config{.metric = "score", .mode = cohort::max, .num_samples = 15, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"a", cohort::uniform(0, 10)}}, {.name = "bohb", .storage_path = storage.string(), .verbose = 0});
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 15);
  std::map<std::size_t, int> ended_at;
  for (auto const& t : grid.trials) {
    CHECK(t.status == "TERMINATED");
    ++ended_at[t.metrics_history.size()];
    for (std::size_t i = 0; i < t.metrics_history.size(); ++i) CHECK(t.metrics_history[i].at("steps") == i + 1);
  }
  CHECK(ended_at == std::map<std::size_t, int>{{1, 6}, {3, 4}, {9, 5}});
  if (world_rank() == 0) {
    // The searcher's saved state: a result observed wherever a trial passes a milestone
    // (budgets 1, 3 and 9), so at 1 every trial (15), at 3 those that reached 3 (3 + 3 + 3), at 9 five.
    std::ifstream in(storage / "bohb" / "experiment_state.json");
    auto const state = nlohmann::json::parse(in);
    std::map<double, std::size_t> per_budget;
    for (auto const& b : state.at("searcher").at("budgets")) per_budget[b.at("budget").get<double>()] = b.at("observations").size();
    CHECK(per_budget == std::map<double, std::size_t>{{1, 15}, {3, 9}, {9, 5}});
  }
}

TEST_CASE("a trial group waiting for another group's long trial is not ended by the collective deadline", "[tuning][mpi]") {
  auto const storage = cohort_test::scratch("tune_wait");
  int const per = world_size() % 2 == 0 ? 2 : 1;  // groups of two ranks: the waiting rank is in a group collective
  // Trial 0 is slow (one report after 7 s); the other trials are fast and done long before it.
  // The groups without work wait for the coordinator's "done" for more than twice the 3 s
  // deadline, which applies to the trials' collectives only. (A 1 s deadline with two 1.5 s
  // reports failed about once in 75 runs on a loaded 2-core machine: the slow trial's two ranks
  // reached a report more than 1 s apart, a lag the deadline rightly ends.)
  struct slow_first {
    void operator()(cohort::context& ctx, nlohmann::json const& config) const {
      std::this_thread::sleep_for(std::chrono::milliseconds(config.at("x").get<double>() == 0.0 ? 7000 : 5));
      ctx.report({{"score", config.at("x").get<double>()}});
    }
  };
  cohort::tuner tuner{slow_first{}, cohort::tune_config{.metric = "score", .mode = cohort::max, .ranks_per_trial = per,
                                                        .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({0.0, 1.0, 2.0})}},
                        {.name = "wait", .storage_path = storage.string(), .verbose = 0, .collective_timeout_ms = 3000});
  REQUIRE(grid.ok());
  CHECK(grid.size() == 3);
  for (auto const& t : grid.trials) CHECK(t.status == "TERMINATED");
}

TEST_CASE("a hostile experiment_state.json is an error naming the file and the field, never another exception", "[tuning][pure][bad-input]") {
  using namespace cohort::tuning::detail;
  std::filesystem::path const file = "exp/experiment_state.json";
  auto state = [](nlohmann::json trials, nlohmann::json searcher = nlohmann::json::object()) {
    return nlohmann::json{{"trials", std::move(trials)}, {"searcher", std::move(searcher)}, {"scheduler", nlohmann::json::object()},
                          {"next_trial", 2}}.dump();
  };
  auto trial = [](nlohmann::json id, std::string status = "RUNNING") {
    return nlohmann::json{{"id", std::move(id)}, {"status", status}, {"config", {{"x", 1}}}, {"last", nlohmann::json::object()}};
  };
  std::string text, expect;
  SECTION("a trial id that leads outside the experiment") {
    text = state({trial("../../outside")});
    expect = "exp/experiment_state.json: field 'trials[0].id' is \"../../outside\", not a trial id like trial_00001";
  }
  SECTION("a trial id that is not a string") {
    text = state({trial(7)});
    expect = "field 'trials[0].id' is not a string";
  }
  SECTION("a trial listed twice") {
    text = state({trial("trial_00001"), trial("trial_00001", "PAUSED")});
    expect = "field 'trials[1].id': trial trial_00001 is listed twice";
  }
  SECTION("a trial at or past next_trial, which the searcher would suggest again") {
    text = state({trial("trial_00002")});
    expect = "field 'trials[0].id' is trial_00002, not below next_trial 2";
  }
  SECTION("an unknown status") {
    text = state({trial("trial_00000", "DONE")});
    expect = "field 'trials[0].status' is \"DONE\", not PENDING, RUNNING, PAUSED, TERMINATED or ERROR";
  }
  SECTION("a checkpoint to restore from outside the trial's directory") {
    auto t = trial("trial_00001");
    t["restore_from"] = "/elsewhere/trial_00000/exploit_1_trial_00000_checkpoint_000002";
    text = state({t});
    expect = "field 'trials[0].restore_from' is \"/elsewhere/trial_00000/exploit_1_trial_00000_checkpoint_000002\", "
             "not a checkpoint in the trial's own directory trial_00001";
  }
  SECTION("a missing next_trial") {
    text = R"({"trials": [], "searcher": {}, "scheduler": {}})";
    expect = "field 'next_trial' is missing";
  }
  SECTION("text that is not JSON") {
    text = R"({"trials": [)";
    expect = "exp/experiment_state.json does not parse (";
  }
  CHECK_THROWS_WITH(parse_experiment_state(text, file),
                    contains_text(expect) && contains_text("move it aside to start the experiment afresh"));
}

TEST_CASE("a restored trial's checkpoint to restore from is taken by name under the experiment's directory", "[tuning][pure][bad-input]") {
  using namespace cohort::tuning::detail;
  auto t = nlohmann::json{{"id", "trial_00001"}, {"status", "PENDING"}, {"config", {{"x", 1}}}, {"last", nlohmann::json::object()},
                          {"restore_from", "/moved/exp/trial_00001/exploit_1_trial_00000_checkpoint_000002"}};
  auto parsed = parse_experiment_state(
      nlohmann::json{{"trials", {t}}, {"searcher", nlohmann::json::object()}, {"scheduler", nlohmann::json::object()}, {"next_trial", 2}}.dump(),
      "exp/experiment_state.json");
  REQUIRE(parsed.trials.size() == 1);
  CHECK(parsed.trials[0].restore_from == (std::filesystem::path("exp") / "trial_00001" / "exploit_1_trial_00000_checkpoint_000002").string());
}

TEST_CASE("a searcher or scheduler state of the wrong shape is an error naming the file and the policy", "[tuning][pure][bad-input]") {
  using namespace cohort::tuning::detail;
  cohort::tuning::space const sp{{"x", cohort::uniform(0, 1)}};
  cohort::tuning::objective const obj{"score", cohort::order::max};
  cohort::search::basic searcher;
  cohort::schedule::asha scheduler;
  searcher.setup(sp, obj, 1);
  scheduler.setup(obj);
  auto good_searcher = searcher.save_state();
  auto parsed = [&](nlohmann::json s, nlohmann::json sch) {
    return parse_experiment_state(
        nlohmann::json{{"trials", nlohmann::json::array()}, {"searcher", std::move(s)}, {"scheduler", std::move(sch)}, {"next_trial", 0}}.dump(),
        "exp/experiment_state.json");
  };
  auto no_seed = good_searcher;
  no_seed.erase("seed");
  CHECK_THROWS_WITH(restore_policies(parsed(no_seed, scheduler.save_state()), searcher, scheduler, "exp/experiment_state.json"),
                    contains_text("exp/experiment_state.json: field 'searcher' is not the state this searcher saved"));
  CHECK_THROWS_WITH(restore_policies(parsed(good_searcher, {{"brackets", "x"}}), searcher, scheduler, "exp/experiment_state.json"),
                    contains_text("exp/experiment_state.json: field 'scheduler' is not the state this scheduler saved"));
  CHECK_NOTHROW(restore_policies(parsed(good_searcher, scheduler.save_state()), searcher, scheduler, "exp/experiment_state.json"));
}
