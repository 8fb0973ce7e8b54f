#include <cohort/tuning/trial_book.hpp>
#include <cohort/tuning/messages.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cohort/tuning/schedulers.hpp>
#include <cohort/tuning/searchers.hpp>
#include <cohort/tuning/stoppers.hpp>

#include "../catch.hpp"
#include "../support.hpp"

// The tuner's decisions on one rank, without MPI or a trainer: the book of trials driven by hand
// as the coordinator drives it with the trial groups' messages.

using nlohmann::json;
namespace search = cohort::search;
namespace schedule = cohort::schedule;
namespace stop = cohort::stop;

namespace {

template <class Stoppers = std::tuple<>>
using grid_book = cohort::tuning::detail::trial_book<search::basic, schedule::fifo, Stoppers>;

/// An empty directory of this rank's own (the cases run on every rank).
std::filesystem::path fresh(std::string const& what) {
  auto dir = cohort_test::scratch(what) / std::to_string(cohort_test::world_rank());
  std::filesystem::create_directories(dir);
  return dir;
}

cohort::space const three{{"a", cohort::grid_search({1, 2, 3})}};

json result(std::string const& id, double score) {
  return {{"trial_id", id}, {"row", {{"score", score}, {"training_iteration", 1}}}};
}
json complete(std::string const& id, std::string const& outcome = "done") {
  return {{"trial_id", id}, {"outcome", outcome}};
}
std::string id_of(std::optional<json> const& a) { return a && a->contains("trial_id") ? a->at("trial_id").get<std::string>() : ""; }
bool done(std::optional<json> const& a) { return a && a->value("done", false); }

std::vector<std::string> statuses(auto const& book) {
  std::vector<std::string> out;
  for (auto const& r : book.rows()) out.push_back(r.status);
  return out;
}

}  // namespace

TEST_CASE("the book runs at most `concurrent` trials, hands out the rest as trials end, then says done", "[tuning][pure]") {
  // Catches: a concurrency limit not kept, a trial handed out twice, "done" before the last
  // trial ended (its group would leave while it still reports) or never.
  auto const dir = fresh("book_concurrent");
  grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 2);
  book.start(three);
  CHECK_FALSE(book.restored());
  CHECK(id_of(book.assignment()) == "trial_00000");
  CHECK(id_of(book.assignment()) == "trial_00001");
  CHECK_FALSE(book.assignment());  // both slots taken
  CHECK(book.on_result(result("trial_00000", 1.0)).at("what") == "proceed");
  book.on_complete(complete("trial_00000"));
  auto third = book.assignment();
  CHECK(id_of(third) == "trial_00002");
  CHECK(third->at("config") == json{{"a", 3}});
  book.on_complete(complete("trial_00001"));
  CHECK_FALSE(book.assignment());  // trial_00002 still runs
  book.on_complete(complete("trial_00002", "error"));
  CHECK(done(book.assignment()));
  CHECK(statuses(book) == std::vector<std::string>{"TERMINATED", "TERMINATED", "ERROR"});
  auto trials = book.take_trials();
  REQUIRE(trials.size() == 3);
  CHECK(trials[0].metrics_history.size() == 1);
  CHECK(trials[0].metrics.at("score") == 1.0);
  CHECK(book.outcome().empty());
}

TEST_CASE("a group asking ahead gets its next trial reserved while its trial runs, where nothing depends on it", "[tuning][pure]") {
  // Catches: no reservation where the next trial cannot depend on a completion (the group then
  // waits for the coordinator as each trial ends), one where it can (a searcher that learns,
  // tune_config.reproducible, max_concurrent_trials, a scheduler that pauses), a reserved trial
  // counted as running (its place taken twice) or started twice, "done" before the last
  // trial ended, or a reserved trial lost when the experiment is interrupted before it starts.
  auto const dir = fresh("book_reservation");
  std::string saved;
  {
    grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
    book.start(three);
    CHECK(id_of(book.assignment()) == "trial_00000");
    auto reserved = book.reservation();
    CHECK(id_of(reserved) == "trial_00001");
    CHECK(reserved->value("reserved", false));
    CHECK(reserved->at("config") == json{{"a", 2}});
    CHECK(statuses(book) == std::vector<std::string>{"RUNNING", "PENDING"});
    CHECK_FALSE(book.assignment());  // one group, its trial running: the reserved one is not handed out again
    book.on_complete(complete("trial_00000"));
    saved = book.state().text();  // the job stops here: trial_00001 reserved, not started
    book.started("trial_00001");
    book.started("trial_00001");
    CHECK(statuses(book) == std::vector<std::string>{"TERMINATED", "RUNNING"});
    CHECK(id_of(book.reservation()) == "trial_00002");
    CHECK_FALSE(book.reservation());  // the grid is exhausted
    book.on_complete(complete("trial_00001"));
    book.started("trial_00002");
    CHECK_FALSE(book.reservation());
    CHECK_FALSE(book.assignment());  // trial_00002 still runs: not done yet
    book.on_complete(complete("trial_00002"));
    CHECK(done(book.assignment()));
    CHECK(statuses(book) == std::vector<std::string>{"TERMINATED", "TERMINATED", "TERMINATED"});
  }
  std::filesystem::create_directories(dir / "again");
  std::ofstream(dir / "again" / "experiment_state.json") << saved;
  grid_book<> again({}, {}, {}, {.metric = "score"}, dir / "again", 1);
  again.start(three);
  CHECK(statuses(again) == std::vector<std::string>{"TERMINATED", "PENDING"});
  CHECK(id_of(again.assignment()) == "trial_00001");
  CHECK(id_of(again.reservation()) == "trial_00002");

  auto const waits = [&](auto& other, std::string const& why, cohort::space const& space = three) {
    INFO(why);
    other.start(space);
    CHECK(id_of(other.assignment()) == "trial_00000");
    CHECK_FALSE(other.reservation());
    other.on_complete(complete("trial_00000"));
    CHECK(id_of(other.assignment()) == "trial_00001");
  };
  cohort::tuning::detail::trial_book<search::tpe, schedule::fifo, std::tuple<>> tpe(
      {}, {}, {}, {.metric = "score", .num_samples = 3}, dir / "tpe", 1);
  waits(tpe, "a searcher that learns from completions", {{"a", cohort::choice({1, 2, 3})}});
  grid_book<> reproducible({}, {}, {}, {.metric = "score", .reproducible = true}, dir / "reproducible", 1);
  waits(reproducible, "reproducible");
  grid_book<> limited({}, {}, {}, {.metric = "score", .max_concurrent_trials = 1}, dir / "limited", 1);
  waits(limited, "max_concurrent_trials");
  cohort::tuning::detail::trial_book<search::basic, schedule::pbt, std::tuple<>> pbt(
      {}, {.hyperparam_mutations = {{"a", schedule::mutation::range{.low = 0.0, .high = 4.0}}}}, {}, {.metric = "score"},
      dir / "pbt", 1);
  waits(pbt, "a scheduler that pauses and exploits");
}

TEST_CASE("a reserved trial's start is told from where it stood when reserved, not from checkpoints it wrote since", "[tuning][pure]") {
  // Catches: the start event's restore point looked up when the group tells of the start (the
  // coordinator may hear of it late, after the trial committed checkpoints: "restored from
  // checkpoint_000004" for a trial that started from scratch), or a restore point missed.
  auto const dir = fresh("book_reserved_start");
  std::vector<std::pair<std::string, std::string>> starts;  // (trial, restored from)
  {
    cohort::report::callback_runner runner([&](cohort::report::callback_record const& e, cohort::report::trial_info const&) {
      if (e.what == cohort::report::callback_event::trial_start) starts.emplace_back(e.trial, e.path.filename().string());
    });
    grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
    book.set_callbacks(&runner);
    book.start(three);
    CHECK(id_of(book.assignment()) == "trial_00000");
    CHECK(id_of(book.reservation()) == "trial_00001");
    book.on_complete(complete("trial_00000"));
    std::filesystem::create_directories(dir / "trial_00001" / "checkpoint_000004");  // written before its start is heard of
    book.started("trial_00001");
    std::filesystem::create_directories(dir / "trial_00002" / "checkpoint_000002");  // a trial that goes on from its own
    CHECK(id_of(book.reservation()) == "trial_00002");
    std::filesystem::create_directories(dir / "trial_00002" / "checkpoint_000003");
    book.on_complete(complete("trial_00001"));
    book.started("trial_00002");
    runner.finish();
  }
  using start = std::pair<std::string, std::string>;
  CHECK(starts == std::vector<start>{{"trial_00000", ""}, {"trial_00001", ""}, {"trial_00002", "checkpoint_000002"}});
}

TEST_CASE("the book's state, read back by a new book, resumes running trials first under the same ids", "[tuning][pure]") {
  // Catches: a resumed experiment that starts trials afresh, loses one that was running, starts
  // over a trial begun after the last state write whose directory has its config (its rows and
  // checkpoints lost), or leaves a stray directory among the trials.
  auto const dir = fresh("book_state");
  std::string saved;
  {
    grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
    book.start(three);
    CHECK(id_of(book.assignment()) == "trial_00000");
    book.on_complete(complete("trial_00000"));
    CHECK(id_of(book.assignment()) == "trial_00001");  // running when the job stops
    CHECK(book.dirty());
    saved = book.state().text();
    CHECK_FALSE(book.dirty());
  }
  std::ofstream(dir / "experiment_state.json") << saved;
  // Begun after the last state write, so not listed: trial_00002 with the config the grid
  // suggests again for it ({"a": 3}) and two rows, a stray trial_00003 of another config.
  std::filesystem::create_directories(dir / "trial_00002");
  std::ofstream(dir / "trial_00002" / "params.json") << R"({"a": 3})";
  std::ofstream(dir / "trial_00002" / "result.json") << "{\"score\":5,\"training_iteration\":1}\n"
                                                     << "{\"score\":6,\"training_iteration\":2}\n";
  std::filesystem::create_directories(dir / "trial_00003");
  std::ofstream(dir / "trial_00003" / "params.json") << R"({"a": 4})";
  grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
  book.start(three);
  CHECK(book.restored());
  CHECK(statuses(book) == std::vector<std::string>{"TERMINATED", "PENDING"});
  CHECK(id_of(book.assignment()) == "trial_00001");
  book.on_complete(complete("trial_00001"));
  CHECK(std::filesystem::exists(dir / "trial_00002"));  // not yet suggested again: left where it is
  CHECK(id_of(book.assignment()) == "trial_00002");
  CHECK(std::filesystem::exists(dir / "trial_00002" / "params.json"));  // same config: resumed in place
  book.on_complete(complete("trial_00002"));
  CHECK(done(book.assignment()));  // the grid is exhausted: the stray directory is set aside
  CHECK_FALSE(std::filesystem::exists(dir / "trial_00003"));
  auto orphans = 0;
  for (auto const& e : std::filesystem::directory_iterator(dir))
    orphans += e.path().filename().string().starts_with("trial_00003.orphaned_");
  CHECK(orphans == 1);
  auto const trials = book.take_trials();
  REQUIRE(trials.size() == 3);
  CHECK(trials[2].metrics_history.size() == 2);  // its rows from before the interruption kept
  CHECK(trials[2].metrics.at("score") == 6);
}

TEST_CASE("the book's state follows every change to a trial, each unchanged trial's part kept from the last one", "[tuning][pure]") {
  // Catches: a trial's part of experiment_state.json or trials.csv kept from an earlier state
  // after the trial changed (a result, its end, a retry), so that a resume or a reader of
  // trials.csv sees it as it was; the state's text not the JSON of the whole state.
  auto const dir = fresh("book_state_parts");
  grid_book<> book({}, {}, {}, {.metric = "score", .max_failures = 1}, dir, 2);
  book.start(three);
  auto trial = [](auto const& parts, std::size_t i) { return json::parse(parts.text()).at("trials").at(i); };
  CHECK(id_of(book.assignment()) == "trial_00000");
  CHECK(id_of(book.assignment()) == "trial_00001");
  auto first = book.state();
  REQUIRE(first.trials.states.size() == 2);
  CHECK(trial(first, 0).at("status") == "RUNNING");
  CHECK(trial(first, 0).at("last") == json::object());
  book.on_result(result("trial_00000", 4.0));
  auto second = book.state();
  CHECK(trial(second, 0).at("last").at("score") == 4.0);
  CHECK(second.trials.rows[0]->last.at("score") == 4.0);
  CHECK(second.trials.states[1] == first.trials.states[1]);  // trial_00001 unchanged: the same part
  book.on_complete(complete("trial_00000"));
  book.on_complete(complete("trial_00001", "error"));  // retried once (max_failures = 1)
  auto third = book.state();
  CHECK(trial(third, 0).at("status") == "TERMINATED");
  CHECK(third.trials.rows[0]->status == "TERMINATED");
  CHECK(trial(third, 1).at("status") == "PENDING");
  CHECK(trial(third, 1).at("failures") == 1);
  CHECK(third.trials.rows[1]->failures == 1);
  // The text is the whole state's JSON: every field, the trials as the roster has them now.
  auto const whole = json::parse(third.text());
  CHECK(whole.at("next_trial") == 2);
  CHECK(whole.at("searcher_exhausted") == false);
  CHECK(whole.contains("searcher"));
  CHECK(whole.contains("scheduler"));
  auto const csv = cohort::report::trials_csv(third.trials.rows);
  CHECK(csv.find("trial_00000,TERMINATED") != std::string::npos);
  CHECK(csv.find("trial_00001,PENDING") != std::string::npos);
}

TEST_CASE("an unlisted trial directory of another config than the one suggested again is set aside", "[tuning][pure]") {
  // Catches: resuming a trial from a checkpoint of another config (the searcher's state was
  // restored to the last write; what it suggests again for the id need not be what ran there).
  auto const dir = fresh("book_orphan");
  std::string saved;
  {
    grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
    book.start(three);
    saved = book.state().text();  // nothing suggested yet
  }
  std::ofstream(dir / "experiment_state.json") << saved;
  std::filesystem::create_directories(dir / "trial_00000" / "checkpoint_000001");
  std::ofstream(dir / "trial_00000" / "params.json") << R"({"a": 2})";  // the grid's first is {"a": 1}
  grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 1);
  book.start(three);
  auto const a = book.assignment();
  CHECK(id_of(a) == "trial_00000");
  CHECK(a->at("config") == json{{"a", 1}});
  CHECK_FALSE(std::filesystem::exists(dir / "trial_00000"));  // moved aside, kept
  auto orphans = 0;
  for (auto const& e : std::filesystem::directory_iterator(dir))
    orphans += e.path().filename().string().starts_with("trial_00000.orphaned_");
  CHECK(orphans == 1);
}

TEST_CASE("a spent time budget stops running trials at their next result and starts no new one", "[tuning][pure]") {
  // Catches: a budget that lets new trials start, or leaves a running trial going.
  auto const dir = fresh("book_budget");
  grid_book<std::tuple<stop::time_budget>> book({}, {}, {stop::time_budget{.time_budget_s = 0}}, {.metric = "score"},
                                                dir, 3);
  book.start(three);
  CHECK(id_of(book.assignment()) == "trial_00000");  // the budget is checked on results and ticks
  CHECK(book.on_result(result("trial_00000", 1.0)).at("what") == "stop");
  CHECK(book.out_of_budget());
  book.on_complete(complete("trial_00000"));
  CHECK(done(book.assignment()));
  CHECK(statuses(book) == std::vector<std::string>{"TERMINATED"});
}

TEST_CASE("a preempted trial is pending again and the experiment ends resumable", "[tuning][pure]") {
  // Catches: a trial stopped by SIGTERM recorded as finished (it would never resume), or an
  // outcome that does not say the experiment resumes.
  auto const dir = fresh("book_preempt");
  grid_book<> book({}, {}, {}, {.metric = "score"}, dir, 2);
  book.start(three);
  CHECK(id_of(book.assignment()) == "trial_00000");
  CHECK(id_of(book.assignment()) == "trial_00001");
  book.on_complete(complete("trial_00000", "preempted"));
  CHECK(book.on_result(result("trial_00001", 2.0)).at("what") == "preempt");
  book.on_complete(complete("trial_00001", "preempted"));
  CHECK(done(book.assignment()));
  CHECK(statuses(book) == std::vector<std::string>{"PENDING", "PENDING"});
  CHECK(book.outcome().value("preempted", false));
  CHECK_THAT(book.outcome().value("error", ""), contains_text("resumes when rerun"));
}

TEST_CASE("a searcher that throws ends the experiment with its error once the running trials end", "[tuning][pure]") {
  // Catches: an exception escaping the coordinator's thread (std::terminate on rank 0), or a
  // failed experiment that still hands out trials.
  auto const dir = fresh("book_searcher");
  struct failing : search::basic {
    int calls = 0;
    std::optional<json> suggest(std::string const& id) {
      if (++calls > 1) throw cohort::error("out of ideas");
      return search::basic::suggest(id);
    }
  };
  cohort::tuning::detail::trial_book<failing, schedule::fifo, std::tuple<>> book({}, {}, {}, {.metric = "score"}, dir, 2);
  book.start(three);
  CHECK(id_of(book.assignment()) == "trial_00000");
  CHECK_FALSE(book.assignment());  // the second suggestion failed; trial_00000 still runs
  CHECK(book.on_result(result("trial_00000", 1.0)).at("what") == "stop");
  book.on_complete(complete("trial_00000"));
  CHECK(done(book.assignment()));
  CHECK_THAT(book.outcome().value("error", ""), contains_text("the searcher failed: out of ideas"));
}

TEST_CASE("under HyperBand the book pauses trials at milestones and resumes or stops them as the bracket decides", "[tuning][pure]") {
  // Catches: paused trials resumed before their bracket decided (the book's own rule for other
  // schedulers), a stop decision for a paused trial not applied, a trial decided while still
  // pausing lost, an experiment that never says done. Trials report one iteration at a time,
  // 1, 2 or 3 at once, their score their config's "a" (trial n has a = n + 1); max_t 9, eta 3:
  // bracket 0 runs trials 0-2 to 9; bracket 1 runs trials 3-7 to 3, then the best two (6, 7) to 9.
  std::size_t const concurrent = GENERATE(1, 2, 3);
  auto const dir = fresh("book_hyperband_" + std::to_string(concurrent));
  std::vector<json> values;
  for (int a = 1; a <= 8; ++a) values.push_back(a);
  cohort::tuning::detail::trial_book<search::basic, schedule::hyperband, std::tuple<>> book(
      {}, {.max_t = 9, .reduction_factor = 3}, {}, {.metric = "score"}, dir, concurrent);
  book.start(cohort::space{{"a", cohort::grid_search(values)}});
  std::map<std::string, int> iteration;
  std::map<std::string, int> score;
  std::deque<std::string> running;
  bool finished = false;
  for (int step = 0; step < 1000 && !finished; ++step) {
    while (auto a = book.assignment()) {
      if (done(a)) {
        finished = true;
        break;
      }
      score[id_of(a)] = a->at("config").at("a").get<int>();
      running.push_back(id_of(a));
    }
    if (finished) break;
    REQUIRE_FALSE(running.empty());  // nothing runs and the book is not done: it would hang
    REQUIRE(running.size() <= concurrent);
    auto id = running.front();
    running.pop_front();
    int const it = ++iteration[id];
    auto what = book.on_result({{"trial_id", id}, {"row", {{"score", score[id]}, {"training_iteration", it}}}}).at("what");
    if (what == "proceed") running.push_back(id);
    else book.on_complete(complete(id, what == "pause" ? "pause" : "done"));
  }
  REQUIRE(finished);
  CHECK(iteration == std::map<std::string, int>{{"trial_00000", 9}, {"trial_00001", 9}, {"trial_00002", 9}, {"trial_00003", 3},
                                                {"trial_00004", 3}, {"trial_00005", 3}, {"trial_00006", 9}, {"trial_00007", 9}});
  CHECK(statuses(book) == std::vector<std::string>(8, "TERMINATED"));
}

TEST_CASE("held results are answered in trial order, each once its turn has come", "[tuning][pure]") {
  // Catches: results answered in arrival order (a reproducible experiment would then depend on
  // timing), one answered before its turn, or one never answered after a decision brought its turn.
  cohort::tuning::detail::held_results held;
  auto at = [](std::string const& id, std::int64_t it) { return json{{"trial_id", id}, {"row", {{"training_iteration", it}}}}; };
  held.hold(2, at("trial_00002", 1));
  held.hold(0, at("trial_00000", 1));
  held.hold(1, at("trial_00001", 2));
  std::int64_t reached_by_0 = 0;  // trial 0 still running: trial 1's iteration 2 waits for it to reach 2
  auto const turn_of = [&](std::size_t n, std::int64_t level) { return n == 0 || reached_by_0 >= level; };
  std::vector<std::string> order;
  auto const decide = [&](json msg) {
    auto id = msg.at("trial_id").get<std::string>();
    order.push_back(id);
    if (id == "trial_00000") reached_by_0 = 1;
    return json{{"what", "proceed"}, {"for", id}};
  };
  auto first = held.release(turn_of, decide);
  REQUIRE(first.size() == 2);
  CHECK(first[0].first == "trial_00000");
  CHECK(first[1].first == "trial_00002");
  CHECK(first[1].second.at("for") == "trial_00002");
  CHECK(order == std::vector<std::string>{"trial_00000", "trial_00002"});
  reached_by_0 = 2;
  auto second = held.release(turn_of, decide);
  REQUIRE(second.size() == 1);
  CHECK(second[0].first == "trial_00001");
  CHECK(held.release(turn_of, decide).empty());
}

TEST_CASE("a pause decided while the trial was still pausing is applied once the pause commits, then forgotten", "[tuning][pure]") {
  // Catches: a stop or resume decided during the pause lost, applied twice, or kept after the
  // trial ended otherwise (a later pause of it would then stop it).
  using cohort::tuning::detail::after_pause;
  auto const exp = fresh("trial_restarts");
  cohort::tuning::detail::trial_roster roster(exp);
  cohort::tuning::detail::trial_restarts restarts(exp);
  for (auto id : {"trial_00000", "trial_00001", "trial_00002"}) {
    cohort::tuning::detail::trial_state t;
    t.id = id;
    roster.run(roster.add(std::move(t)));
  }
  int terminated = 0, readded = 0;
  cohort::tuning::paused_decisions d;
  d.stop = {"trial_00000"};
  d.resume = {"trial_00001"};
  CHECK(restarts.apply(d, roster, [&](auto&) { ++terminated; }, [&](auto&) { ++readded; }));
  CHECK(terminated == 0);  // still RUNNING: applied when its pause commits
  CHECK(restarts.take("trial_00000") == after_pause::stop);
  CHECK(restarts.take("trial_00000") == after_pause::stay_paused);
  CHECK(restarts.take("trial_00002") == after_pause::stay_paused);
  restarts.forget(roster.at("trial_00001"));  // it ended otherwise
  CHECK(restarts.take("trial_00001") == after_pause::stay_paused);
  CHECK_FALSE(restarts.apply({}, roster, [&](auto&) { ++terminated; }, [&](auto&) { ++readded; }));
  CHECK(readded == 0);
}

TEST_CASE("the book names the results it is sure to answer proceed: the scheduler's span, while nothing else can decide", "[tuning][pure]") {
  // Catches: a span given where a stopper, the reproducible order or a stopping experiment could
  // answer otherwise (the group would not wait for that answer), or one wider than ASHA's next rung.
  auto const dir = fresh("book_quiet");
  grid_book<> fifo_book({}, {}, {}, {.metric = "score"}, dir / "fifo", 2);
  fifo_book.start(three);
  CHECK(id_of(fifo_book.assignment()) == "trial_00000");
  auto const any = fifo_book.quiet_span("trial_00000");
  REQUIRE(any);
  CHECK(any->key.empty());
  CHECK(any->below == std::numeric_limits<double>::infinity());

  grid_book<std::tuple<stop::maximum_iterations>> stopped({}, {}, {stop::maximum_iterations{.max_iter = 5}}, {.metric = "score"},
                                                          dir / "stopper", 2);
  stopped.start(three);
  CHECK(id_of(stopped.assignment()) == "trial_00000");
  CHECK_FALSE(stopped.quiet_span("trial_00000"));

  grid_book<> in_order({}, {}, {}, {.metric = "score", .reproducible = true}, dir / "reproducible", 2);
  in_order.start(three);
  CHECK(id_of(in_order.assignment()) == "trial_00000");
  CHECK_FALSE(in_order.quiet_span("trial_00000"));

  cohort::tuning::detail::trial_book<search::basic, schedule::asha, std::tuple<>> rungs({}, {}, {}, {.metric = "score"}, dir / "asha", 2);
  rungs.start(three);  // asha's defaults: rungs at 1, 4, 16, 64; max_t 100
  CHECK(id_of(rungs.assignment()) == "trial_00000");
  CHECK(rungs.quiet_span("trial_00000")->below == 1);
  CHECK(rungs.on_result(result("trial_00000", 1.0)).at("what") == "proceed");
  auto const next = rungs.quiet_span("trial_00000");
  REQUIRE(next);
  CHECK(next->key == "training_iteration");
  CHECK(next->below == 4);
  rungs.fail("the tuner's own failure");
  CHECK_FALSE(rungs.quiet_span("trial_00000"));  // stopping: every answer is stop
}

TEST_CASE("a leader sends quiet only results inside the span of the coordinator's last answer, for at most max_quiet or one result", "[tuning][pure]") {
  // Catches: a result outside the span sent without waiting (its stop would be lost), a span kept
  // after an answer without one, or quiet results past max_quiet after the first (a stopping
  // experiment would not reach an unbounded span).
  using cohort::tuning::detail::quiet_results;
  auto const row = [](json iteration) { return json{{"score", 1.0}, {"training_iteration", iteration}}; };
  quiet_results quiet;
  CHECK_FALSE(quiet.send_quiet(row(1)));  // no answer yet
  quiet.answered({{"what", "proceed"}, {"quiet", quiet_results::to_json({.key = "training_iteration", .below = 4})}});
  CHECK_FALSE(quiet.send_quiet(row(4)));
  CHECK_FALSE(quiet.send_quiet(row(std::numeric_limits<double>::quiet_NaN())));
  CHECK_FALSE(quiet.send_quiet(row("3")));
  CHECK_FALSE(quiet.send_quiet(json{{"score", 1.0}}));
  CHECK(quiet.send_quiet(row(2)));
  CHECK(quiet.send_quiet(row(3)));
  quiet.answered({{"what", "proceed"}});
  CHECK_FALSE(quiet.send_quiet(row(1)));
  auto const unbounded = quiet_results::to_json({});
  CHECK_FALSE(unbounded.contains("below"));  // JSON text has no infinity
  quiet.answered({{"what", "proceed"}, {"quiet", unbounded}});
  std::this_thread::sleep_for(quiet_results::max_quiet + std::chrono::milliseconds(2));
  CHECK(quiet.send_quiet(json{{"score", 1.0}}));        // the first after the answer, however late
  CHECK_FALSE(quiet.send_quiet(json{{"score", 1.0}}));  // then it waits
}

TEST_CASE("quiet results go in batches while they come fast, at once after a pause", "[tuning][pure]") {
  // Catches: every result sent alone (no batch), a batch that grows past max_rows, a result after
  // a pause held back, rows lost or reordered between add() and take().
  using cohort::tuning::detail::quiet_batch;
  quiet_batch batch;
  CHECK(batch.empty());
  CHECK(batch.add(json{{"i", 0}}));  // the first: nothing came before it
  auto first = batch.take("trial_00001");
  CHECK(first.at("trial_id") == "trial_00001");
  CHECK(first.at("quiet") == true);
  CHECK(cohort::tuning::detail::decode_history(first.at("rows").get_binary()) == std::vector<json>{json{{"i", 0}}});
  CHECK(batch.empty());
  std::size_t messages = 0, since_take = 0, largest = 0;
  std::vector<json> received;
  for (int i = 1; i <= 2000; ++i) {
    ++since_take;
    if (!batch.add(json{{"i", i}})) continue;
    ++messages;
    largest = std::max(largest, since_take);
    since_take = 0;
    for (auto& row : cohort::tuning::detail::decode_history(batch.take("t").at("rows").get_binary())) received.push_back(std::move(row));
  }
  CHECK(messages < 2000 / 4);  // 2,000 results in far less than max_age each: batched
  CHECK(largest <= quiet_batch::max_rows);
  if (!batch.empty())
    for (auto& row : cohort::tuning::detail::decode_history(batch.take("t").at("rows").get_binary())) received.push_back(std::move(row));
  REQUIRE(received.size() == 2000);
  for (int i = 0; i < 2000; ++i) CHECK(received[static_cast<std::size_t>(i)].at("i") == i + 1);
  std::this_thread::sleep_for(quiet_batch::max_age + std::chrono::milliseconds(1));
  CHECK(batch.add(json{{"i", 2001}}));  // after a pause: at once
}

TEST_CASE("the trials sent to the other ranks at the end decode to what rank 0 holds, NaN included", "[tuning][pure]") {
  // Catches: a config, metrics, history or checkpoint's metrics lost or left moved-out on rank 0
  // by the encoding, or a field dropped.
  std::vector<cohort::tuning::trial_result> trials(2);
  trials[0].id = "trial_00000";
  trials[0].status = "TERMINATED";
  trials[0].config = {{"a", 1}};
  trials[0].metrics_history = {{{"score", 1.5}, {"training_iteration", 1}}, {{"score", std::numeric_limits<double>::quiet_NaN()}, {"training_iteration", 2}}};
  trials[0].metrics = trials[0].metrics_history.back();
  trials[0].path = "exp/trial_00000";
  trials[0].checkpoints = {{"exp/trial_00000/checkpoint_000001", {{"score", 1.5}}}};
  trials[1].id = "trial_00001";
  trials[1].status = "ERROR";
  trials[1].error = "broken";
  trials[1].num_failures = 2;
  auto const bytes = cohort::tuning::detail::encode_trials(trials);
  REQUIRE(trials[0].metrics_history.size() == 2);  // rank 0's own grid keeps its histories,
  CHECK(trials[0].config == json{{"a", 1}});        // configs
  CHECK(trials[0].metrics.at("training_iteration") == 2);  // metrics
  CHECK(trials[0].checkpoints.at(0).metrics == json{{"score", 1.5}});  // and checkpoints' metrics
  auto const back = cohort::tuning::detail::decode_trials(bytes);
  REQUIRE(back.size() == 2);
  CHECK(back[0].id == "trial_00000");
  CHECK(back[0].config == json{{"a", 1}});
  CHECK(back[0].metrics.at("training_iteration") == 2);
  REQUIRE(back[0].checkpoints.size() == 1);
  CHECK(back[0].checkpoints[0].path == "exp/trial_00000/checkpoint_000001");
  CHECK(back[0].checkpoints[0].metrics == json{{"score", 1.5}});
  CHECK(back[0].path == "exp/trial_00000");
  REQUIRE(back[0].metrics_history.size() == 2);
  CHECK(back[0].metrics_history[0] == trials[0].metrics_history[0]);
  CHECK(std::isnan(back[0].metrics_history[1].at("score").get<double>()));
  CHECK(back[1].error == std::optional<std::string>("broken"));
  CHECK(back[1].num_failures == 2);
  CHECK(back[1].metrics_history.empty());
}

TEST_CASE("a history's bytes decode to the same rows, whatever their keys and values", "[tuning][pure]") {
  // Catches: a row given the keys of another key set (after the keys change, or change back), a
  // value's type or bits changed (NaN, infinities, large unsigned, negative integers, nested
  // values), a non-object row dropped, and bytes that encode_history did not write taken as rows.
  using cohort::tuning::detail::decode_history;
  using cohort::tuning::detail::encode_history;
  double const nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<json> const rows{
      {{"loss", 0.5}, {"training_iteration", 1}},
      {{"loss", -inf}, {"training_iteration", 2}},
      {{"acc", 0.9}, {"loss", inf}, {"training_iteration", 3}},  // a new key
      {{"loss", 0.25}, {"training_iteration", 4}},                // the first keys again
      {{"loss", "n/a"}, {"training_iteration", std::uint64_t{18446744073709551615u}}},
      {{"done", true}, {"loss", nullptr}, {"nested", {{"a", json::array({1, "b", false})}}}, {"training_iteration", -6}},
      json::object(),
      json(7.5),  // not an object
      {{"loss", nan}, {"training_iteration", 9}},
  };
  auto const bytes = encode_history(rows);
  auto const back = decode_history(bytes);
  REQUIRE(back.size() == rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i == rows.size() - 1) continue;  // NaN != NaN
    CHECK(back[i] == rows[i]);
    CHECK(back[i].dump() == rows[i].dump());  // types too (1 and 1.0 compare equal)
  }
  CHECK(std::isnan(back.back().at("loss").get<double>()));
  CHECK(back.back().at("training_iteration") == 9);
  CHECK(back[4].at("training_iteration").is_number_unsigned());
  CHECK(back[5].at("training_iteration").is_number_integer());
  CHECK(decode_history(encode_history({})).empty());
  std::vector<json> many_sets;  // every row's keys its own, then the first keys again, sets later
  for (int i = 0; i < 40; ++i) many_sets.push_back({{"k" + std::to_string(i), i}});
  many_sets.push_back({{"k0", -1}});
  CHECK(decode_history(encode_history(many_sets)) == many_sets);

  auto truncated = bytes;
  truncated.pop_back();
  CHECK_THROWS_AS(decode_history(truncated), std::runtime_error);
  auto longer = bytes;
  longer.push_back(0);
  CHECK_THROWS_AS(decode_history(longer), std::runtime_error);
  auto unknown_set = encode_history({{{"loss", 1.0}}});
  unknown_set[4] = 5;  // the first row's key set: only 0 (new) can come first
  CHECK_THROWS_AS(decode_history(unknown_set), std::runtime_error);
  CHECK_THROWS_AS(decode_history(cohort::tuning::detail::history_bytes{0xff, 0xff, 0xff, 0x7f}), std::runtime_error);
}
