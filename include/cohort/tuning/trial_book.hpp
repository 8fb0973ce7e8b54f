#pragma once
/// \file
/// The tuner's book of trials: every trial of an experiment and the decisions about them (which
/// trial runs next, what a reported result means for it, what a finished trial becomes), made
/// by the searcher, the scheduler and the stoppers it owns. No MPI and no threads: the
/// coordinator (coordinator.hpp) serves it to the trial groups under its mutex, and the tests
/// drive it on one rank.

#include <algorithm>
#include <concepts>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
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
#include "cohort/tuning/trial_roster.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

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
      : searcher_(std::move(searcher)), scheduler_(std::move(scheduler)), stoppers_(std::move(stoppers)),
        cfg_(std::move(cfg)), exp_(exp), concurrent_(concurrent), roster_(std::move(exp)),
        feed_(cfg_.reproducible, [this](std::string const& why) { fail(why); }) {}
  trial_book(trial_book const&) = delete;  // feed_ reports to this book
  trial_book& operator=(trial_book const&) = delete;

  /// Sets up the searcher and scheduler, and restores an interrupted experiment from
  /// experiment_state.json when there is one. Throws cohort::error on bad input.
  void start(tuning::space const& space) {
    objective const obj{cfg_.metric, cfg_.mode};
    searcher_.setup(space, obj, cfg_.num_samples);
    scheduler_.setup(obj);
    auto state_path = exp_ / "experiment_state.json";
    std::error_code ec;
    if (!std::filesystem::exists(state_path, ec)) return;
    auto state = read_experiment_state(state_path);  // checked: ids, statuses, fields
    restore_policies(state, searcher_, scheduler_, state_path);
    next_ = state.next_trial;
    exhausted_ = state.searcher_exhausted;
    std::vector<std::string> ended, rejoined;  // unfinished trials not resumed; ERROR trials that go on
    for (auto& t : state.trials) {
      bool const unfinished = t.status == "RUNNING" || t.status == "PENDING" || t.status == "PAUSED";
      bool const errored_again = t.status == "ERROR" && (cfg_.resume_errored || cfg_.restart_errored);
      if (errored_again && cfg_.restart_errored) {
        set_aside(exp_, t.id, ".restarted_");  // kept, not deleted: it starts over in a fresh directory
        t.saved_last = nlohmann::json::object();
        t.restore_from.clear();
      }
      t.history = read_result_rows(exp_ / t.id);
      if (errored_again) drop_rows_after_checkpoint(t);
      auto const status = t.status;
      auto& added = roster_.add(std::move(t));
      if (unfinished && !cfg_.resume_unfinished) {
        ended.push_back(added.id);
      } else if (status == "RUNNING" || status == "PENDING" || errored_again) {
        if (errored_again) rejoined.push_back(added.id);
        added.error.clear();
        roster_.queue_last(added);
      } else if (status == "PAUSED") {
        roster_.pause(added);
      }
    }
    for (auto const& id : ended) terminate(roster_.at(id));
    for (auto const& id : rejoined) safely([&] { scheduler_.on_trial_add(id, roster_.at(id).config); });
    unlisted_ = unlisted_trials(exp_, roster_);
    restored_ = true;
    if (exhausted_) mark_exhausted();
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
    if (roster_.running() < concurrent_ && fatal_.empty() && !stopping_) {
      auto id = next_to_run();
      if (id && fatal_.empty()) {
        auto& t = roster_.at(*id);
        roster_.run(t);
        dirty_ = true;
        if (!t.restore_from.empty() && !cohort::checkpointing::committed(exp_ / t.id).empty()) t.restore_from.clear();
        if (callbacks_) callbacks_.start(t);
        return nlohmann::json{
            {"trial_id", t.id}, {"config", t.config}, {"restore_from", t.restore_from}, {"num_failures", t.failures}};
      }
    }
    bool const more = fatal_.empty() && !stopping_ && (!roster_.nothing_queued() || !roster_.nothing_paused() || !exhausted_);
    if (roster_.running() == 0 && !more) return nlohmann::json{{"done", true}};
    return std::nullopt;
  }

  /// A result of a running trial, under tune_config::reproducible: held until every earlier
  /// trial still running has reported as far (release() answers it then).
  void hold(nlohmann::json msg) {
    auto const n = trial_number(msg.at("trial_id").get<std::string>()).value_or(0);
    held_[n] = std::move(msg);
  }

  /// The held results whose turn has come, in trial order, each with its answer: (trial id, answer).
  std::vector<std::pair<std::string, nlohmann::json>> release() {
    std::vector<std::pair<std::string, nlohmann::json>> out;
    for (bool more = true; more;) {
      more = false;
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        auto const level = it->second.at("row").value("training_iteration", std::int64_t{0});
        if (!turn_of(it->first, level)) continue;
        auto msg = std::move(it->second);
        held_.erase(it);
        auto id = msg.at("trial_id").get<std::string>();
        nlohmann::json answer;
        try {
          answer = on_result(std::move(msg));
        } catch (std::exception const& e) {  // a broken invariant of the tuner: its group still gets an answer
          fail(std::string("the tuner's coordinator failed: ") + e.what());
          answer = {{"what", "stop"}};
        }
        out.emplace_back(std::move(id), std::move(answer));
        more = true;
        break;
      }
    }
    return out;
  }

  /// A result of a running trial: the stoppers and the scheduler decide what it does next.
  nlohmann::json on_result(nlohmann::json msg) {
    auto& t = roster_.at(msg.at("trial_id").get<std::string>());
    t.history.push_back(std::move(msg.at("row")));
    auto const& row = t.history.back();
    dirty_ = true;
    if (callbacks_) callbacks_.result(t);
    if constexpr (requires(Searcher& s) { s.on_trial_result(t.id, row); })  // BOHB: results at milestones
      tell_searcher(t, searcher_event::result, row);
    if (!preempted_.empty()) return {{"what", "preempt"}};  // every running trial stops, resumable
    if (stopping_) return {{"what", "stop"}};
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
        return exploit(t, std::move(d));
    }
    return {{"what", "proceed"}};
  }

  /// A trial ended (its group sends the outcome: done, error, pause, exploit, preempted).
  void on_complete(nlohmann::json const& msg) {
    auto& t = roster_.at(msg.at("trial_id").get<std::string>());
    auto const outcome = msg.at("outcome").get<std::string>();
    roster_.finished_running();
    dirty_ = true;
    if (outcome == "error" && retry(t, msg.value("error", std::string("failed")))) {
      // runs again from its latest checkpoint: the searcher and scheduler see one trial going on
    } else if (outcome == "error") {
      t.status = "ERROR";
      t.error = msg.value("error", std::string("failed"));
      if (callbacks_) {
        callbacks_.checkpoints(t);
        callbacks_.runner->trial_error(t.id, t.error);
      }
      tell_searcher(t, searcher_event::complete, nlohmann::json());
      safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
    } else if (outcome == "preempted" || outcome == "preempt") {
      // SIGTERM/SIGINT: the trial committed its checkpoint; it resumes when the experiment is rerun.
      roster_.queue_first(t);
      stopping_ = true;
      if (preempted_.empty()) preempted_ = msg.value("error", std::string("stopped by a signal"));
    } else if (outcome == "pause") {
      if constexpr (requires(Searcher& s) { s.on_trial_pause(t.id, t.last()); })  // BOHB: a result at a milestone
        tell_searcher(t, searcher_event::pause, t.last());
      if (stop_when_paused_.erase(t.id)) {
        terminate(t);
      } else if (exploit_when_paused_.erase(t.id)) {
        continue_from_donor(t);  // the donor's checkpoint was cloned when it was decided
      } else if (resume_when_paused_.erase(t.id)) {
        roster_.queue_last(t);
      } else {
        roster_.pause(t);
      }
    } else if (outcome == "exploit" && t.exploit) {
      continue_from_donor(t);
    } else {
      terminate(t);
    }
    if (outcome != "pause") {
      stop_when_paused_.erase(t.id);
      resume_when_paused_.erase(t.id);
      if (exploit_when_paused_.erase(t.id)) t.exploit.reset();
    }
    apply_paused_decisions();
  }

  /// A trial whose functor threw: counted, and queued first to run again from its latest committed
  /// checkpoint while tune_config::max_failures allows (true), its results after that checkpoint
  /// dropped from its history (the rerun reports them again). False: it is to end as ERROR.
  bool retry(trial_state& t, std::string const& why) {
    if (failed_by_tuner_.erase(t.id)) return false;
    ++t.failures;
    if (cfg_.max_failures >= 0 && t.failures > static_cast<std::size_t>(cfg_.max_failures)) return false;
    if (!fatal_.empty() || stopping_) return false;
    auto const kept = drop_rows_after_checkpoint(t);
    std::cerr << "[cohort] " + t.id + " failed (failure " + std::to_string(t.failures) +
                     (cfg_.max_failures < 0 ? std::string{} : " of at most " + std::to_string(cfg_.max_failures) + " retried") +
                     "): " + why + "; it runs again from " +
                     (kept.empty() ? (t.restore_from.empty() ? std::string("the start") : t.restore_from)
                                   : kept.back().filename().string()) +
                     "\n"
              << std::flush;
    roster_.queue_first(t);
    return true;
  }

  /// Before a trial goes on from its latest committed checkpoint (a retry, a resumed ERROR
  /// trial): the results it reported after that checkpoint leave its history, as the rerun
  /// reports them again (all of them when it has none; none when it starts from a PBT donor's
  /// clone). Returns its committed checkpoints.
  std::vector<std::filesystem::path> drop_rows_after_checkpoint(trial_state& t) {
    std::int64_t from = 0;  // the iteration it resumes after
    auto kept = checkpointing::committed(exp_ / t.id);
    if (!kept.empty()) from = cohort::checkpoint::from_directory(kept.back()).metadata().value("training_iteration", std::int64_t{0});
    else if (!t.restore_from.empty()) from = -1;  // a PBT clone of another trial's checkpoint: its rows stay
    if (from >= 0)
      std::erase_if(t.history, [&](auto const& row) { return row.value("training_iteration", std::int64_t{0}) > from; });
    return kept;
  }

  /// The experiment's time budget (the stoppers' stop_all): true once it is spent, after which
  /// no trial starts and every running one stops at its next result.
  bool out_of_budget() {
    if (!stopping_ && std::apply([&](auto&... s) { return (false || ... || s.stop_all(elapsed_s())); }, stoppers_))
      stopping_ = true;
    return stopping_;
  }

  /// The experiment cannot go on: running trials stop at their next result, no new one starts,
  /// and fit() reports `why` on every rank.
  void fail(std::string const& why) {
    if (fatal_.empty()) fatal_ = why;
    stopping_ = true;
  }

  /// The scheduler's lines for the status table: its debug_string() (Ray's), when it has one.
  std::string scheduler_lines() const {
    if constexpr (requires { scheduler_.debug_string(); }) return scheduler_.debug_string();
    else return "";
  }

  /// Seconds since the book was made.
  double elapsed_s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  /// Every trial, in creation order, as the status table and trials.csv show it.
  std::vector<report::trial_row> rows() const { return roster_.rows(); }
  /// Every trial's results so far, in creation order (as rows()): a copy.
  std::vector<std::vector<nlohmann::json>> histories() const { return roster_.histories(); }

  /// experiment_state.json's contents (parse_experiment_state reads them back); clears dirty().
  nlohmann::json state() {
    dirty_ = false;
    return {{"trials", roster_.to_json()}, {"searcher", searcher_.save_state()}, {"scheduler", scheduler_.save_state()},
            {"next_trial", next_}, {"searcher_exhausted", exhausted_}};
  }

  /// At the end: every trial, in creation order, their histories moved out of the book.
  std::vector<tuning::trial_result> take_trials() { return roster_.take_results(); }

  /// Why the experiment did not finish (the error and whether it was preempted), as JSON.
  nlohmann::json outcome() const {
    nlohmann::json out = nlohmann::json::object();
    if (!fatal_.empty()) out["error"] = fatal_;
    else if (!preempted_.empty()) out["error"] = preempted_ + " (the experiment resumes when rerun with the same name)";
    if (!preempted_.empty()) out["preempted"] = true;
    return out;
  }

 private:
  /// The trial to start next: a queued one, else a new one from the searcher, else (the searcher
  /// exhausted) a paused one. Nothing when there is none now.
  std::optional<std::string> next_to_run() {
    if (auto id = roster_.take_queued()) return id;
    if (!exhausted_) {
      if (auto id = suggest()) return id;
      if (!roster_.nothing_queued()) return next_to_run();  // the searcher's end let paused trials go on
    }
    // A paused trial waits for its scheduler's word where the scheduler gives one (HyperBand);
    // with nothing else running or queued, or a scheduler that gives none, the first resumes.
    if (exhausted_ && !roster_.nothing_paused() && (!directs_paused || (roster_.running() == 0 && roster_.nothing_queued()))) {
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
    auto candidate = trial_id(next_);
    std::optional<nlohmann::json> config;
    try {
      config = searcher_.suggest(candidate);
    } catch (std::exception const& e) {
      fail(std::string("the searcher failed: ") + e.what());
    }
    if (!config) {
      mark_exhausted();
      return std::nullopt;
    }
    ++next_;
    trial_state t;
    t.id = candidate;
    t.config = *config;
    if (unlisted_.erase(candidate) > 0) {
      if (same_trial(exp_ / candidate, t.config)) t.history = read_result_rows(exp_ / candidate);  // resumed, its rows kept
      else set_aside_orphan(exp_, candidate);
    }
    try {
      scheduler_.on_trial_add(t.id, t.config);
    } catch (std::exception const& e) {
      fail(std::string("the scheduler failed: ") + e.what());
    }
    roster_.add(std::move(t));
    return candidate;
  }

  /// PBT's exploit: the donor's checkpoint cloned into the trial's directory, the trial told to
  /// end and start again from it (continue_from_donor, when its group completes it).
  nlohmann::json exploit(trial_state& t, scheduling_decision d) {
    auto clone = clone_checkpoint(exp_, d.donor, t.id, clones_);
    if (!clone) {
      // The donor has no committed checkpoint yet: the trial keeps its own config (PBT had
      // already switched it to the new one; adding the trial again restores it).
      safely([&] { scheduler_.on_trial_add(t.id, t.config); });
      return {{"what", "proceed"}};
    }
    d.config = d.config.is_null() ? roster_.at(d.donor).config : d.config;
    t.exploit = d;
    t.exploit->donor = *clone;
    return {{"what", "exploit"}};
  }

  /// The trial continues from the donor's checkpoint with the perturbed config.
  void continue_from_donor(trial_state& t) {
    supersede_checkpoints(exp_ / t.id, clones_);
    t.config = t.exploit->config;
    t.restore_from = t.exploit->donor;
    t.exploit.reset();
    roster_.queue_first(t);
  }

  /// A paused (or still pausing) trial the scheduler restarts from a donor (synchronous PBT):
  /// the donor's latest checkpoint is cloned now, while the donor waits at the same point as the
  /// trial. Returns false when the donor has none: the trial keeps its config and resumes.
  bool clone_for_restart(trial_state& t, scheduling_decision d) {
    auto clone = clone_checkpoint(exp_, d.donor, t.id, clones_);
    if (!clone) {
      safely([&] { scheduler_.on_trial_add(t.id, t.config); });
      return false;
    }
    t.exploit = std::move(d);
    t.exploit->donor = *clone;
    return true;
  }

  /// Whether the scheduler decides about paused trials itself (HyperBand, synchronous PBT): which
  /// resume, which stop, which restart from a donor.
  static constexpr bool directs_paused = requires(Scheduler& s) {
    { s.take_paused_decisions() } -> std::same_as<paused_decisions>;
  };

  /// The searcher has no more trials: a scheduler that waits for more is told.
  void mark_exhausted() {
    exhausted_ = true;
    for (auto const& id : unlisted_) set_aside_orphan(exp_, id);  // never suggested again
    unlisted_.clear();
    if constexpr (requires(Scheduler& s) { s.on_no_more_trials(); }) safely([&] { scheduler_.on_no_more_trials(); });
    apply_paused_decisions();
  }

  /// The scheduler's decisions about paused trials: a paused trial stops (TERMINATED) or is
  /// queued again; one still pausing does so once its pause is committed (on_complete).
  void apply_paused_decisions() {
    if constexpr (directs_paused) {
      paused_decisions d;
      safely([&] { d = scheduler_.take_paused_decisions(); });
      using line = trial_roster::line;
      for (auto const& id : d.stop) {
        auto* t = roster_.find(id);
        if (!t) continue;
        // Waiting (queued: pausing when the experiment was interrupted) ends now; running, once paused.
        if (roster_.take_out(id) != line::none) terminate(*t);
        else if (t->status == "RUNNING") stop_when_paused_.insert(id);
      }
      for (auto& [id, exploit] : d.exploit) {
        auto* t = roster_.find(id);
        if (!t) continue;
        bool const cloned = clone_for_restart(*t, std::move(exploit));
        if (roster_.take_out(id) == line::none) {
          if (t->status != "RUNNING") continue;
          if (cloned) exploit_when_paused_.insert(id);
          else resume_when_paused_.insert(id);
          continue;
        }
        if (cloned) continue_from_donor(*t);
        else roster_.queue_last(*t);
      }
      for (auto const& id : d.resume) {
        auto* t = roster_.find(id);
        if (!t) continue;
        if (t->status == "PAUSED" && roster_.take_out(id) == line::paused) roster_.queue_last(*t);
        else if (t->status == "RUNNING") resume_when_paused_.insert(id);
      }
      dirty_ = dirty_ || !d.stop.empty() || !d.resume.empty() || !d.exploit.empty();
    }
  }

  /// The trial ended for good: the searcher and the scheduler are told.
  void terminate(trial_state& t) {
    t.status = "TERMINATED";
    dirty_ = true;
    if (callbacks_) {
      callbacks_.checkpoints(t);
      callbacks_.runner->trial_complete(t.id);
    }
    tell_searcher(t, searcher_event::complete, t.last());
    safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
  }

  /// Tells the searcher of a trial's result, pause or end (searcher_feed: at once, or under
  /// tune_config::reproducible in trial order).
  void tell_searcher(trial_state const& t, searcher_event what, nlohmann::json const& row) {
    feed_.tell(searcher_, t.id, trial_number(t.id).value_or(0), what, row);
  }

  /// Under tune_config::reproducible, before suggesting trial next_: whether every trial below
  /// next_ - reproducible_lag has ended (fewer where the scheduler pauses trials until later ones
  /// join them: HyperBand's trials_settled_before); if so their events are handed to the
  /// searcher, in trial order (those not handed over yet).
  bool searcher_caught_up() {
    std::size_t upto = next_ > cfg_.reproducible_lag ? next_ - cfg_.reproducible_lag : 0;
    if constexpr (requires(Scheduler const& s) {
                    { s.trials_settled_before(next_) } -> std::convertible_to<std::size_t>;
                  })
      upto = std::min(upto, scheduler_.trials_settled_before(next_));
    return feed_.catch_up(searcher_, upto, [&](std::string const& id) { return roster_.ended_or_absent(id); });
  }

  /// Under tune_config::reproducible: whether trial number `n`'s result at iteration `level` may
  /// be decided on, every earlier trial still running having reported that far (a retried trial
  /// waiting for a group excepted, and everything once the experiment stops).
  bool turn_of(std::size_t n, std::int64_t level) const {
    return stopping_ || !preempted_.empty() || roster_.running_before_reached(n, level);
  }

  template <class F>
  void safely(F&& f) {
    try {
      f();
    } catch (std::exception const& e) {
      fail(e.what());
    }
  }

  Searcher searcher_;
  Scheduler scheduler_;
  Stoppers stoppers_;
  tune_config cfg_;
  std::filesystem::path exp_;
  std::size_t concurrent_;
  trial_roster roster_;
  std::set<std::string> unlisted_;  ///< on restore: directories the state does not list, until suggested again
  std::set<std::string> stop_when_paused_, resume_when_paused_;  ///< decided while the trial was still pausing
  std::set<std::string> exploit_when_paused_;  ///< the same, for a restart from a donor (cloned: trial_state::exploit)
  std::set<std::string> failed_by_tuner_;  ///< trials the scheduler failed on: their error is not retried
  std::map<std::size_t, nlohmann::json> held_;  ///< tune_config::reproducible: results held for their turn, by trial number
  searcher_feed feed_;
  std::size_t next_ = 0, clones_ = 0;
  bool exhausted_ = false, stopping_ = false, dirty_ = true, restored_ = false;
  std::string fatal_, preempted_;
  trial_callbacks callbacks_{};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace cohort::tuning::detail
