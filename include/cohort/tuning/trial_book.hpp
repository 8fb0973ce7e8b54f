#pragma once
/// \file
/// The tuner's book of trials: every trial of an experiment and the decisions about them (which
/// trial runs next, what a reported result means for it, what a finished trial becomes), made
/// by the searcher, the scheduler and the stoppers it owns. No MPI and no threads: the
/// coordinator (coordinator.hpp) serves it to the trial groups under its mutex, and the tests
/// drive it on one rank.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/detail/utc_stamp.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/report/trial_table.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/result_grid.hpp"
#include "cohort/tuning/search_space.hpp"
#include "cohort/tuning/trial_directories.hpp"
#include "cohort/tuning/trial_events.hpp"
#include "cohort/tuning/trial_restarts.hpp"
#include "cohort/tuning/trial_restore.hpp"
#include "cohort/tuning/trial_roster.hpp"
#include "cohort/tuning/trial_source.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

/// Why an experiment stops before its trials are done: the tuner's own failure (its searcher,
/// scheduler or an invariant), a signal (SIGTERM/SIGINT: it resumes when rerun), or its stoppers'
/// time budget. Once stopping, no trial starts and every running one stops at its next result.
struct experiment_stop {
  std::string fatal;      ///< the first failure of the tuner: fit() reports it on every rank
  std::string preempted;  ///< the signal's message
  bool stopping = false;

  void fail(std::string const& why) {
    if (fatal.empty()) fatal = why;
    stopping = true;
  }
  void preempt(std::string const& why) {
    if (preempted.empty()) preempted = why;
    stopping = true;
  }
  /// {"error", "preempted"}, as trial_book::outcome() gives it.
  nlohmann::json outcome() const {
    nlohmann::json out = nlohmann::json::object();
    if (!fatal.empty()) out["error"] = fatal;
    else if (!preempted.empty()) out["error"] = preempted + " (the experiment resumes when rerun with the same name)";
    if (!preempted.empty()) out["preempted"] = true;
    return out;
  }
};

/// The trials of one experiment in the directory `exp`, at most `concurrent` of them running at
/// once, and the searcher, scheduler and stoppers that decide about them. Messages in and out are
/// the JSON the trial groups exchange with the coordinator (messages.hpp): an assignment
/// {"trial_id", "config", "restore_from", "num_failures"} or {"done": true}; a result {"trial_id", "row"} answered
/// with {"what": proceed|stop|pause|exploit|preempt|error}; a completion {"trial_id", "outcome"}.
template <class Searcher, class Scheduler, class Stoppers>
class trial_book {
 public:
  trial_book(Searcher searcher, Scheduler scheduler, Stoppers stoppers, tune_config cfg, std::filesystem::path exp,
             std::size_t concurrent)
      : source_(std::move(searcher), cfg.reproducible, exp, [this](std::string const& why) { fail(why); }),
        scheduler_(std::move(scheduler)), stoppers_(std::move(stoppers)), cfg_(std::move(cfg)), exp_(exp),
        concurrent_(concurrent), roster_(exp), restarts_(std::move(exp)) {}
  trial_book(trial_book const&) = delete;  // source_ reports failures to this book
  trial_book& operator=(trial_book const&) = delete;

  /// Sets up the searcher and scheduler, and restores an interrupted experiment from
  /// experiment_state.json when there is one. Throws cohort::error on bad input.
  void start(tuning::space const& space) {
    objective const obj{cfg_.metric, cfg_.mode};
    source_.searcher().setup(space, obj, cfg_.num_samples);
    scheduler_.setup(obj);
    auto state_path = exp_ / "experiment_state.json";
    std::error_code ec;
    if (!std::filesystem::exists(state_path, ec)) return;
    auto state = read_experiment_state(state_path);  // checked: ids, statuses, fields
    restore_policies(state, source_.searcher(), scheduler_, state_path);
    auto const restored = restore_trials(std::move(state.trials), cfg_, exp_, roster_);
    for (auto const& id : restored.ended) terminate(roster_.at(id));
    for (auto const& id : restored.rejoined) safely([&] { scheduler_.on_trial_add(id, roster_.at(id).config); });
    source_.restore(state.next_trial, state.searcher_exhausted, unlisted_trials(exp_, roster_));
    restored_ = true;
    if (source_.exhausted()) mark_exhausted();
    else apply_paused_decisions();  // decisions saved before the interruption
  }

  /// Rank 0's callbacks (report/callbacks.hpp), told of every trial's start, results,
  /// checkpoints and end from here on; null for none. Outlives the book's use of it.
  void set_callbacks(report::callback_runner* callbacks) { callbacks_ = {.runner = callbacks, .exp = exp_}; }

  /// Whether start() restored an interrupted experiment.
  bool restored() const { return restored_; }

  /// Whether anything changed since the last state() was taken.
  bool dirty() const { return dirty_; }

  /// The next trial for a free group, {"done": true} when there will be none, or nothing yet.
  std::optional<nlohmann::json> assignment() {
    if (roster_.running() < concurrent_ && end_.fatal.empty() && !end_.stopping) {
      auto id = next_to_run();
      if (id && end_.fatal.empty()) {
        auto& t = roster_.at(*id);
        auto a = assignment_of(t);
        started(t, callbacks_ ? callbacks_.start_point(t) : std::filesystem::path{});
        return a;
      }
    }
    bool const more = end_.fatal.empty() && !end_.stopping && (!roster_.nothing_queued() || !roster_.nothing_paused() || !source_.exhausted());
    if (roster_.running() == 0 && !more) return nlohmann::json{{"done", true}};
    return std::nullopt;
  }

  /// The next trial for a group whose trial still runs, to start as soon as that one ends (the
  /// group asks ahead as each trial starts), where what runs next cannot depend on a running
  /// trial's completion (next_is_independent); it stays PENDING until its group starts it
  /// (started). Nothing otherwise, or when there is no trial to run now: the group's request
  /// then waits for its trial's completion, as any other.
  std::optional<nlohmann::json> reservation() {
    if (!next_is_independent() || !end_.fatal.empty() || end_.stopping || !end_.preempted.empty()) return std::nullopt;
    auto id = next_to_run();
    if (!id || !end_.fatal.empty()) return std::nullopt;
    auto& t = roster_.at(*id);
    dirty_ = true;
    auto a = assignment_of(t);
    a["reserved"] = true;
    // Where it starts from is as it is now: by the time its group tells of its start, the trial
    // may have committed checkpoints of its own.
    reserved_.emplace(t.id, callbacks_ ? callbacks_.start_point(t) : std::filesystem::path{});
    return a;
  }

  /// A group started trial `id`: RUNNING from now on where reservation() gave it (returns true);
  /// nothing for a trial that assignment() gave (already RUNNING).
  bool started(std::string const& id) {
    auto r = reserved_.extract(id);
    if (r) started(roster_.at(id), r.mapped());
    return !r.empty();
  }

  /// Under tune_config::reproducible: whether trial number `n`'s result at iteration `level` may
  /// be decided on, every earlier trial still running having reported that far (a retried trial
  /// waiting for a group excepted, and everything once the experiment stops).
  bool turn_of(std::size_t n, std::int64_t level) const {
    return end_.stopping || !end_.preempted.empty() || roster_.running_before_reached(n, level);
  }

  /// A result of a running trial: the stoppers and the scheduler decide what it does next.
  nlohmann::json on_result(nlohmann::json msg) {
    return on_result(msg.at("trial_id").get_ref<std::string const&>(), std::move(msg.at("row")));
  }
  /// on_result of trial `id`'s `result` (a row).
  nlohmann::json on_result(std::string const& id, nlohmann::json result) {
    auto& t = roster_.at(id);
    t.history.push_back(std::move(result));
    auto const& row = t.history.back();
    dirty_ = true;
    if (callbacks_) callbacks_.result(t);
    if constexpr (requires(Searcher& s) { s.on_trial_result(t.id, row); })  // BOHB: results at milestones
      source_.tell(t, searcher_event::result, row);
    if (!end_.preempted.empty()) return {{"what", "preempt"}};  // every running trial stops, resumable
    if (end_.stopping) return {{"what", "stop"}};
    bool stop = std::apply([&](auto&... s) { return (false || ... || s.stop_trial(t.id, row)); }, stoppers_);
    if (out_of_budget()) stop = true;
    if (stop) return {{"what", "stop"}};
    scheduling_decision d;
    try {
      d = scheduler_.on_trial_result(t.id, row);
    } catch (std::exception const& e) {
      failed_by_tuner_.insert(t.id);  // not the trial's fault: not retried
      return {{"what", "error"}, {"error", std::string("the scheduler failed on ") + t.id + ": " + e.what()}};
    }
    apply_paused_decisions();
    switch (d.what) {
      case decision::proceed:
        return {{"what", "proceed"}};
      case decision::stop:
        return {{"what", "stop"}};
      case decision::pause:
        // A trial resumed after a pause with nothing else to run would be paused forever.
        if (t.resumed_after_pause && roster_.running() <= 1 && roster_.nothing_queued()) return {{"what", "proceed"}};
        return {{"what", "pause"}};
      case decision::exploit:
        if (restarts_.clone_donor(t, std::move(d), roster_)) return {{"what", "exploit"}};
        // The donor has no committed checkpoint yet: the trial keeps its own config (PBT had
        // already switched it to the new one; adding the trial again restores it).
        safely([&] { scheduler_.on_trial_add(t.id, t.config); });
        return {{"what", "proceed"}};
    }
    return {{"what", "proceed"}};
  }

  /// The trial's next results that on_result is sure to answer `proceed`, so that its group may
  /// send them without waiting: the scheduler's proceeds(id), where it has one, while the
  /// experiment is not stopping, with no stopper and not under tune_config::reproducible (whose
  /// answers wait for their turn). Nothing otherwise, and when proceeds() throws: the experiment
  /// then fails with the cause (its trials stop at their next result), as when on_trial_add throws.
  std::optional<proceed_span> quiet_span(std::string const& id) {
    if constexpr (requires(Scheduler const& s) {
                    { s.proceeds(id) } -> std::same_as<proceed_span>;
                  }) {
      if (!cfg_.reproducible && std::tuple_size_v<Stoppers> == 0 && !end_.stopping) {
        proceed_span span;
        try {
          span = scheduler_.proceeds(id);
        } catch (std::exception const& e) {
          fail(std::string("the scheduler failed: ") + e.what());
          return std::nullopt;
        }
        if (span.below > -std::numeric_limits<double>::infinity()) return span;  // NaN and -inf: none
      }
    }
    return std::nullopt;
  }

  /// A trial ended (its group sends the outcome: done, error, pause, exploit, preempted).
  void on_complete(nlohmann::json const& msg) {
    auto& t = roster_.at(msg.at("trial_id").get<std::string>());
    auto const outcome = msg.at("outcome").get<std::string>();
    roster_.finished_running();
    t.retained_at_end.reset();
    dirty_ = true;
    if (outcome == "error" && retry(t, msg.value("error", std::string("failed")))) {
      // runs again from its latest checkpoint: the searcher and scheduler see one trial going on
    } else if (outcome == "error") {
      t.status = "ERROR";
      t.error = msg.value("error", std::string("failed"));
      if (callbacks_) callbacks_.error(t);
      source_.tell(t, searcher_event::complete, nlohmann::json());
      safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
    } else if (outcome == "preempted" || outcome == "preempt") {
      // SIGTERM/SIGINT: the trial committed its checkpoint; it resumes when the experiment is rerun.
      roster_.queue_first(t);
      end_.preempt(msg.value("error", std::string("stopped by a signal")));
    } else if (outcome == "pause") {
      if constexpr (requires(Searcher& s) { s.on_trial_pause(t.id, t.last()); })  // BOHB: a result at a milestone
        source_.tell(t, searcher_event::pause, t.last());
      switch (restarts_.take(t.id)) {
        case after_pause::stop: terminate(t); break;
        case after_pause::from_donor: restarts_.continue_from_donor(t, roster_); break;
        case after_pause::resume: roster_.queue_last(t); break;
        case after_pause::stay_paused: roster_.pause(t); break;
      }
    } else if (outcome == "exploit" && t.exploit) {
      restarts_.continue_from_donor(t, roster_);
    } else {
      if (msg.contains("checkpoints")) t.retained_at_end = msg["checkpoints"].get<std::vector<std::string>>();
      terminate(t);
    }
    if (outcome != "pause") restarts_.forget(t);
    apply_paused_decisions();
  }

  /// A trial whose functor threw: counted, and queued first to run again from its latest committed
  /// checkpoint while tune_config::max_failures allows (true), its results after that checkpoint
  /// dropped from its history (the rerun reports them again). False: it is to end as ERROR.
  bool retry(trial_state& t, std::string const& why) {
    if (failed_by_tuner_.erase(t.id)) return false;
    ++t.failures;
    if ((cfg_.max_failures >= 0 && t.failures > static_cast<std::size_t>(cfg_.max_failures)) || end_.stopping) return false;
    rerun_from_checkpoint(t, why, cfg_.max_failures, exp_, roster_);
    return true;
  }

  /// The experiment's time budget (the stoppers' stop_all): true once it is spent, after which
  /// no trial starts and every running one stops at its next result.
  bool out_of_budget() {
    if (!end_.stopping && std::apply([&](auto&... s) { return (false || ... || s.stop_all(elapsed_s())); }, stoppers_))
      end_.stopping = true;
    return end_.stopping;
  }

  /// The experiment cannot go on: running trials stop at their next result, no new one starts,
  /// and fit() reports `why` on every rank.
  void fail(std::string const& why) { end_.fail(why); }

  /// The scheduler's lines for the status table: its debug_string() (Ray's), when it has one.
  std::string scheduler_lines() const {
    if constexpr (requires { scheduler_.debug_string(); }) return scheduler_.debug_string();
    else return "";
  }

  /// Seconds since the book was made.
  double elapsed_s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  /// Every trial, in creation order, as the status table and trials.csv show it.
  std::vector<report::trial_row> rows() const { return roster_.rows(); }
  /// Every trial's results so far, in creation order (as rows()): a copy of at most `most` of
  /// each trial's results, evenly spaced.
  std::vector<std::vector<nlohmann::json>> histories(std::size_t most) const { return roster_.histories(most); }

  /// experiment_state.json (parse_experiment_state reads it back) and trials.csv's rows, as the
  /// book is now: `head` every field but "trials", the trials' parts shared with the last state()
  /// where a trial has not changed since (trial_roster::view). Clears dirty().
  struct state_parts {
    nlohmann::json head;
    trial_roster::view trials;
    /// experiment_state.json's text.
    std::string text() const { return experiment_state_text(head, trials.states); }
  };
  state_parts state() {
    dirty_ = false;
    return {.head = {{"searcher", source_.searcher().save_state()}, {"scheduler", scheduler_.save_state()},
                     {"next_trial", source_.next()}, {"searcher_exhausted", source_.exhausted()}},
            .trials = roster_.take_view()};
  }

  /// At the end: every trial, in creation order, their histories moved out of the book.
  std::vector<tuning::trial_result> take_trials() { return roster_.take_results(); }

  /// Why the experiment did not finish (the error and whether it was preempted), as JSON.
  nlohmann::json outcome() const { return end_.outcome(); }

 private:
  /// Whether the next trial to run is the same whenever a running trial's completion comes:
  /// search::basic (grid and random: its suggestions learn nothing), a scheduler that never
  /// pauses or exploits (fifo, asha: a completion only updates what it compares results with),
  /// one trial per group (no tune_config::max_concurrent_trials) and not tune_config::reproducible.
  /// Then a group gets its next trial while its trial runs (reservation), and starts it without
  /// asking the coordinator as the trial ends (bench_tune scale/N).
  bool next_is_independent() const {
    return independent_of_completions<Searcher> && independent_of_completions<Scheduler> && !cfg_.reproducible &&
           cfg_.max_concurrent_trials == 0;
  }

  /// `t` starts on a group from checkpoint `from` (empty: from scratch): RUNNING, and the
  /// callbacks told.
  void started(trial_state& t, std::filesystem::path const& from) {
    roster_.run(t);
    dirty_ = true;
    if (callbacks_) callbacks_.start(t, from);
  }

  /// The message that hands `t` to a group (its restore_from cleared where the trial has
  /// committed checkpoints of its own: it resumes from them).
  nlohmann::json assignment_of(trial_state& t) const {
    if (!t.restore_from.empty() && !cohort::checkpointing::committed(exp_ / t.id).empty()) t.restore_from.clear();
    return nlohmann::json{
        {"trial_id", t.id}, {"config", t.config}, {"restore_from", t.restore_from}, {"num_failures", t.failures}};
  }

  /// The trial to start next: a queued one, else a new one from the searcher, else (the searcher
  /// exhausted) a paused one. Nothing when there is none now.
  std::optional<std::string> next_to_run() {
    if (auto id = roster_.take_queued()) return id;
    if (!source_.exhausted()) {
      if (auto id = suggest()) return id;
      if (!roster_.nothing_queued()) return next_to_run();  // the searcher's end let paused trials go on
    }
    // A paused trial waits for its scheduler's word where the scheduler gives one (HyperBand);
    // with nothing else running or queued, or a scheduler that gives none, the first resumes.
    if (source_.exhausted() && !roster_.nothing_paused() && (!directs_paused || (roster_.running() == 0 && roster_.nothing_queued()))) {
      auto id = roster_.take_paused();
      roster_.at(*id).resumed_after_pause = true;
      return id;
    }
    return std::nullopt;
  }

  /// A new trial from the searcher, added to the scheduler; nothing (and exhausted) when the
  /// searcher has no more.
  std::optional<std::string> suggest() {
    if (cfg_.reproducible && !searcher_caught_up()) return std::nullopt;  // waits: not exhausted
    auto t = source_.suggest();
    if (!t) {
      mark_exhausted();
      return std::nullopt;
    }
    try {
      scheduler_.on_trial_add(t->id, t->config);
    } catch (std::exception const& e) {
      fail(std::string("the scheduler failed: ") + e.what());
    }
    return roster_.add(std::move(*t)).id;
  }

  /// Whether the scheduler decides about paused trials itself (HyperBand, synchronous PBT): which
  /// resume, which stop, which restart from a donor.
  static constexpr bool directs_paused = requires(Scheduler& s) {
    { s.take_paused_decisions() } -> std::same_as<paused_decisions>;
  };

  /// The searcher has no more trials: a scheduler that waits for more is told.
  void mark_exhausted() {
    source_.exhaust();
    if constexpr (requires(Scheduler& s) { s.on_no_more_trials(); }) safely([&] { scheduler_.on_no_more_trials(); });
    apply_paused_decisions();
  }

  /// The scheduler's decisions about paused trials (trial_restarts::apply), where it makes them.
  void apply_paused_decisions() {
    if constexpr (directs_paused) {
      paused_decisions d;
      safely([&] { d = scheduler_.take_paused_decisions(); });
      auto const readd = [&](trial_state& t) { safely([&] { scheduler_.on_trial_add(t.id, t.config); }); };
      if (restarts_.apply(std::move(d), roster_, [&](trial_state& t) { terminate(t); }, readd)) dirty_ = true;
    }
  }

  /// The trial ended for good: the searcher and the scheduler are told.
  void terminate(trial_state& t) {
    t.status = "TERMINATED";
    dirty_ = true;
    if (callbacks_) callbacks_.complete(t);
    source_.tell(t, searcher_event::complete, t.last());
    safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
  }

  /// Under tune_config::reproducible, before suggesting trial n = source_.next(): whether every
  /// trial below n - reproducible_lag has ended (fewer where the scheduler pauses trials until later ones
  /// join them: HyperBand's trials_settled_before); if so their events are handed to the
  /// searcher, in trial order (those not handed over yet).
  bool searcher_caught_up() {
    auto const next = source_.next();
    std::size_t upto = next > cfg_.reproducible_lag ? next - cfg_.reproducible_lag : 0;
    if constexpr (requires(Scheduler const& s) {
                    { s.trials_settled_before(next) } -> std::convertible_to<std::size_t>;
                  })
      upto = std::min(upto, scheduler_.trials_settled_before(next));
    return source_.caught_up(upto, [&](std::string const& id) { return roster_.ended_or_absent(id); });
  }

  template <class F>
  void safely(F&& f) {
    try {
      f();
    } catch (std::exception const& e) {
      fail(e.what());
    }
  }

  trial_source<Searcher> source_;  ///< the searcher and the trial numbers it gave out
  Scheduler scheduler_;
  Stoppers stoppers_;
  tune_config cfg_;
  std::filesystem::path exp_;
  std::size_t concurrent_;
  /// Trials given to a group ahead (reservation), not started yet, each with the checkpoint it
  /// starts from (trial_callbacks::start_point when it was given).
  std::map<std::string, std::filesystem::path> reserved_;
  trial_roster roster_;
  trial_restarts restarts_;  ///< PBT's exploits, the scheduler's decisions about paused trials
  std::set<std::string> failed_by_tuner_;  ///< trials the scheduler failed on: their error is not retried
  bool dirty_ = true, restored_ = false;
  experiment_stop end_;
  trial_callbacks callbacks_{};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace cohort::tuning::detail
