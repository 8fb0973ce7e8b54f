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
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

/// The id of the n-th trial: trial_00000, trial_00001, ...
inline std::string trial_id(std::size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "trial_%05zu", n);
  return buf;
}

/// PBT: copies the latest good checkpoint of trial `donor` into trial `into`'s directory (the
/// donor's retention may delete its own copy at any time) as exploit_<n>_<donor>_<name>, `n`
/// the experiment's count of clones (`clones`, advanced first), and returns the copy's path;
/// nothing when the donor has none (`clones` unchanged) or the copy fails.
inline std::optional<std::string> clone_checkpoint(std::filesystem::path const& exp, std::string const& donor,
                                                   std::string const& into, std::size_t& clones) {
  auto from = cohort::checkpointing::latest_good(exp / donor);
  if (!from) return std::nullopt;
  auto dest = exp / into / ("exploit_" + std::to_string(++clones) + "_" + donor + "_" + from->path().filename().string());
  std::error_code ec;
  std::filesystem::create_directories(dest.parent_path(), ec);
  std::filesystem::copy(from->path(), dest, std::filesystem::copy_options::recursive, ec);
  if (ec || cohort::checkpointing::verify(dest)) {
    std::filesystem::remove_all(dest, ec);
    return std::nullopt;
  }
  return dest.string();
}

/// PBT: the committed checkpoints of a trial that continues from a donor's belong to the
/// abandoned lineage: kept, moved under its superseded/ (suffixed _<n>).
inline void supersede_checkpoints(std::filesystem::path const& trial_dir, std::size_t n) {
  std::error_code ec;
  auto old = cohort::checkpointing::committed(trial_dir);
  if (!old.empty()) std::filesystem::create_directories(trial_dir / "superseded", ec);
  for (auto const& dir : old)
    std::filesystem::rename(dir, trial_dir / "superseded" / (dir.filename().string() + "_" + std::to_string(n)), ec);
}

/// On resuming: the trial directories of `exp` that experiment_state.json does not list (begun
/// after its last write; the searcher suggests them again under the same ids).
template <class Known>
std::set<std::string> unlisted_trials(std::filesystem::path const& exp, Known const& known) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto const& entry : std::filesystem::directory_iterator(exp, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("trial_", 0) == 0 && name.size() == 11 && !known.contains(name)) out.insert(name);
  }
  return out;
}

/// Whether the unlisted trial directory `dir` is the one of a trial suggested again with
/// `config`: its params.json holds exactly that config. Then the trial resumes in it, from its
/// latest checkpoint (the trainer's own resume), instead of starting over.
inline bool same_trial(std::filesystem::path const& dir, nlohmann::json const& config) {
  std::ifstream in(dir / "params.json", std::ios::binary);
  auto const params = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !params.is_discarded() && params == config;
}

/// Moves a trial directory aside as <id><why><time> (kept, not deleted), if it exists.
inline void set_aside(std::filesystem::path const& exp, std::string const& id, char const* why) {
  std::error_code ec;
  if (std::filesystem::exists(exp / id, ec)) std::filesystem::rename(exp / id, exp / (id + why + cohort::detail::utc_stamp()), ec);
}
/// Moves an unlisted trial directory that is not resumed aside as <id>.orphaned_<time> (kept, not
/// deleted): its checkpoints may belong to another config.
inline void set_aside_orphan(std::filesystem::path const& exp, std::string const& id) { set_aside(exp, id, ".orphaned_"); }

/// The trials of one experiment in the directory `exp`, at most `concurrent` of them running at
/// once, and the searcher, scheduler and stoppers that decide about them. Messages in and out are
/// the JSON the trial groups exchange with the coordinator (messages.hpp): an assignment
/// {"trial_id", "config", "restore_from"} or {"done": true}; a result {"trial_id", "row"} answered
/// with {"what": proceed|stop|pause|exploit|preempt|error}; a completion {"trial_id", "outcome"}.
template <class Searcher, class Scheduler, class Stoppers>
class trial_book {
 public:
  trial_book(Searcher searcher, Scheduler scheduler, Stoppers stoppers, tune_config cfg, std::filesystem::path exp,
             std::size_t concurrent)
      : searcher_(std::move(searcher)), scheduler_(std::move(scheduler)), stoppers_(std::move(stoppers)),
        cfg_(std::move(cfg)), exp_(std::move(exp)), concurrent_(concurrent) {}

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
      if (unfinished && !cfg_.resume_unfinished) {
        ended.push_back(t.id);
      } else if (t.status == "RUNNING" || t.status == "PENDING" || errored_again) {
        if (errored_again) rejoined.push_back(t.id);
        t.status = "PENDING";
        t.error.clear();
        queue_.push_back(t.id);
      } else if (t.status == "PAUSED") {
        paused_.push_back(t.id);
      }
      order_.push_back(t.id);
      trials_.emplace(t.id, std::move(t));
    }
    for (auto const& id : ended) terminate(trials_.at(id));
    for (auto const& id : rejoined) safely([&] { scheduler_.on_trial_add(id, trials_.at(id).config); });
    unlisted_ = unlisted_trials(exp_, trials_);
    restored_ = true;
    if (exhausted_) mark_exhausted();
    else apply_paused_decisions();  // decisions saved before the interruption
  }

  /// Rank 0's callbacks (report/callbacks.hpp), told of every trial's start, results,
  /// checkpoints and end from here on; null for none. Outlives the book's use of it.
  void set_callbacks(report::callback_runner* callbacks) { callbacks_ = callbacks; }

  /// Whether start() restored an interrupted experiment.
  bool restored() const { return restored_; }

  /// Whether anything changed since the last state() was taken.
  bool dirty() const { return dirty_; }

  /// The next trial for a free group, {"done": true} when there will be none, or nothing yet.
  std::optional<nlohmann::json> assignment() {
    if (running_ < concurrent_ && fatal_.empty() && !stopping_) {
      auto id = next_to_run();
      if (id && fatal_.empty()) {
        auto& t = trials_.at(*id);
        t.status = "RUNNING";
        ++running_;
        dirty_ = true;
        if (!t.restore_from.empty() && !cohort::checkpointing::committed(exp_ / t.id).empty()) t.restore_from.clear();
        if (callbacks_) tell_start(t);
        return nlohmann::json{{"trial_id", t.id}, {"config", t.config}, {"restore_from", t.restore_from}};
      }
    }
    bool const more = fatal_.empty() && !stopping_ && (!queue_.empty() || !paused_.empty() || !exhausted_);
    if (running_ == 0 && !more) return nlohmann::json{{"done", true}};
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
    auto& t = trials_.at(msg.at("trial_id").get<std::string>());
    t.history.push_back(std::move(msg.at("row")));
    auto const& row = t.history.back();
    dirty_ = true;
    if (callbacks_) tell_result(t);
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
        if (t.resumed_after_pause && running_ <= 1 && queue_.empty()) return {{"what", "proceed"}};
        return {{"what", "pause"}};
      case decision::exploit:
        return exploit(t, std::move(d));
    }
    return {{"what", "proceed"}};
  }

  /// A trial ended (its group sends the outcome: done, error, pause, exploit, preempted).
  void on_complete(nlohmann::json const& msg) {
    auto& t = trials_.at(msg.at("trial_id").get<std::string>());
    auto const outcome = msg.at("outcome").get<std::string>();
    --running_;
    dirty_ = true;
    if (outcome == "error" && retry(t, msg.value("error", std::string("failed")))) {
      // runs again from its latest checkpoint: the searcher and scheduler see one trial going on
    } else if (outcome == "error") {
      t.status = "ERROR";
      t.error = msg.value("error", std::string("failed"));
      if (callbacks_) {
        tell_checkpoints(t);
        callbacks_->trial_error(t.id, t.error);
      }
      tell_searcher(t, searcher_event::complete, nlohmann::json());
      safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
    } else if (outcome == "preempted" || outcome == "preempt") {
      // SIGTERM/SIGINT: the trial committed its checkpoint; it resumes when the experiment is rerun.
      t.status = "PENDING";
      queue_.push_front(t.id);
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
        t.status = "PENDING";
        queue_.push_back(t.id);
      } else {
        t.status = "PAUSED";
        paused_.push_back(t.id);
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
    t.status = "PENDING";
    queue_.push_front(t.id);
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
  std::vector<report::trial_row> rows() const {
    std::vector<report::trial_row> out;
    for (auto const& id : order_) {
      auto const& t = trials_.at(id);
      out.push_back({t.id, t.status, t.config, t.last(), (exp_ / t.id).string(), t.error, t.failures});
    }
    return out;
  }

  /// Every trial's results so far, in creation order (as rows()): a copy.
  std::vector<std::vector<nlohmann::json>> histories() const {
    std::vector<std::vector<nlohmann::json>> out;
    out.reserve(order_.size());
    for (auto const& id : order_) out.push_back(trials_.at(id).history);
    return out;
  }

  /// experiment_state.json's contents (parse_experiment_state reads them back); clears dirty().
  nlohmann::json state() {
    dirty_ = false;
    nlohmann::json trials = nlohmann::json::array();
    for (auto const& id : order_) trials.push_back(trials_.at(id));
    return {{"trials", trials}, {"searcher", searcher_.save_state()}, {"scheduler", scheduler_.save_state()},
            {"next_trial", next_}, {"searcher_exhausted", exhausted_}};
  }

  /// At the end: every trial, in creation order, their histories moved out of the book.
  std::vector<tuning::trial_result> take_trials() {
    std::vector<tuning::trial_result> out;
    out.reserve(order_.size());
    for (auto const& id : order_) {
      auto& t = trials_.at(id);
      tuning::trial_result r;
      r.id = t.id;
      r.status = t.status;
      r.config = t.config;
      r.metrics = t.last();
      r.metrics_history = std::move(t.history);
      r.path = exp_ / t.id;
      r.num_failures = t.failures;
      if (!t.error.empty()) r.error = t.error;
      for (auto const& dir : checkpointing::committed(r.path))
        r.checkpoints.push_back({dir, cohort::checkpoint::from_directory(dir).metadata().value("metrics", nlohmann::json::object())});
      out.push_back(std::move(r));
    }
    return out;
  }

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
    if (!queue_.empty()) {
      auto id = queue_.front();
      queue_.pop_front();
      return id;
    }
    if (!exhausted_) {
      if (auto id = suggest()) return id;
      if (!queue_.empty()) return next_to_run();  // the searcher's end let paused trials go on
    }
    // A paused trial waits for its scheduler's word where the scheduler gives one (HyperBand);
    // with nothing else running or queued, or a scheduler that gives none, the first resumes.
    if (exhausted_ && !paused_.empty() && (!directs_paused || (running_ == 0 && queue_.empty()))) {
      auto id = paused_.front();
      paused_.pop_front();
      trials_.at(id).resumed_after_pause = true;
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
    order_.push_back(t.id);
    trials_.emplace(t.id, std::move(t));
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
    d.config = d.config.is_null() ? trials_.at(d.donor).config : d.config;
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
    t.status = "PENDING";
    queue_.push_front(t.id);
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
      for (auto const& id : d.stop) {
        auto it = trials_.find(id);
        if (it == trials_.end()) continue;
        if (auto p = std::find(paused_.begin(), paused_.end(), id); p != paused_.end()) {
          paused_.erase(p);
          terminate(it->second);
        } else if (auto q = std::find(queue_.begin(), queue_.end(), id); q != queue_.end()) {
          queue_.erase(q);  // pausing when the experiment was interrupted: pending since
          terminate(it->second);
        } else if (it->second.status == "RUNNING") {
          stop_when_paused_.insert(id);
        }
      }
      for (auto& [id, exploit] : d.exploit) {
        auto it = trials_.find(id);
        if (it == trials_.end()) continue;
        auto& t = it->second;
        bool const cloned = clone_for_restart(t, std::move(exploit));
        if (auto p = std::find(paused_.begin(), paused_.end(), id); p != paused_.end()) {
          paused_.erase(p);
        } else if (auto q = std::find(queue_.begin(), queue_.end(), id); q != queue_.end()) {
          queue_.erase(q);  // pausing when the experiment was interrupted: pending since
        } else {
          if (t.status != "RUNNING") continue;
          if (cloned) exploit_when_paused_.insert(id);
          else resume_when_paused_.insert(id);
          continue;
        }
        if (cloned) {
          continue_from_donor(t);
        } else {
          t.status = "PENDING";
          queue_.push_back(id);
        }
      }
      for (auto const& id : d.resume) {
        auto it = trials_.find(id);
        if (it == trials_.end()) continue;
        if (auto p = std::find(paused_.begin(), paused_.end(), id); p != paused_.end()) {
          paused_.erase(p);
          it->second.status = "PENDING";
          queue_.push_back(id);
        } else if (it->second.status == "RUNNING") {
          resume_when_paused_.insert(id);
        }
      }
      dirty_ = dirty_ || !d.stop.empty() || !d.resume.empty() || !d.exploit.empty();
    }
  }

  /// The trial ended for good: the searcher and the scheduler are told.
  void terminate(trial_state& t) {
    t.status = "TERMINATED";
    dirty_ = true;
    if (callbacks_) {
      tell_checkpoints(t);
      callbacks_->trial_complete(t.id);
    }
    tell_searcher(t, searcher_event::complete, t.last());
    safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
  }

  /// Callbacks: the trial starts, or goes on from a checkpoint (its own latest, or a donor's copy).
  void tell_start(trial_state const& t) {
    std::filesystem::path from = t.restore_from;
    if (from.empty()) {
      auto kept = cohort::checkpointing::committed(exp_ / t.id);
      if (!kept.empty()) from = kept.back();
    }
    callbacks_->trial_start({.id = t.id, .config = t.config, .path = exp_ / t.id}, from);
  }

  /// Callbacks: a result, and the checkpoint it committed (sync checkpoints are committed before
  /// the result is sent; async ones are found at the trial's end, tell_checkpoints).
  void tell_result(trial_state& t) {
    auto const& row = t.history.back();
    callbacks_->trial_result(t.id, row);
    auto const iteration = row.value("training_iteration", std::int64_t{0});
    auto dir = exp_ / t.id / checkpointing::dir_name(iteration);
    std::error_code ec;
    if (iteration > t.told_checkpoint && std::filesystem::is_directory(dir, ec)) {
      t.told_checkpoint = iteration;
      callbacks_->checkpoint(t.id, std::move(dir));
    }
  }

  /// Callbacks: the trial's committed checkpoints not told yet (async mode commits after the result).
  void tell_checkpoints(trial_state& t) {
    for (auto const& dir : cohort::checkpointing::committed(exp_ / t.id)) {
      auto const iteration = std::stoll(dir.filename().string().substr(11));  // checkpoint_NNNNNN
      if (iteration <= t.told_checkpoint) continue;
      t.told_checkpoint = iteration;
      callbacks_->checkpoint(t.id, dir);
    }
  }

  enum class searcher_event { result, pause, complete };

  /// Tells the searcher of a trial's result, pause or end: at once, or under
  /// tune_config::reproducible kept until searcher_caught_up() hands them over in trial order.
  void tell_searcher(trial_state const& t, searcher_event what, nlohmann::json const& row) {
    if (cfg_.reproducible) {
      searcher_events_[trial_number(t.id).value_or(0)].emplace_back(what, row);
      return;
    }
    deliver_to_searcher(t.id, what, row);
  }

  void deliver_to_searcher(std::string const& id, searcher_event what, nlohmann::json const& row) {
    if (what == searcher_event::complete) {
      safely([&] { searcher_.on_trial_complete(id, row); });
    } else if (what == searcher_event::pause) {
      if constexpr (requires(Searcher& s) { s.on_trial_pause(id, row); }) safely([&] { searcher_.on_trial_pause(id, row); });
    } else {
      if constexpr (requires(Searcher& s) { s.on_trial_result(id, row); }) safely([&] { searcher_.on_trial_result(id, row); });
    }
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
    for (std::size_t j = told_upto_; j < upto; ++j) {
      auto it = trials_.find(trial_id(j));
      if (it != trials_.end() && it->second.status != "TERMINATED" && it->second.status != "ERROR") return false;
    }
    for (; told_upto_ < upto; ++told_upto_) {
      auto ev = searcher_events_.find(told_upto_);
      if (ev == searcher_events_.end()) continue;
      for (auto const& [what, row] : ev->second) deliver_to_searcher(trial_id(told_upto_), what, row);
      searcher_events_.erase(ev);
    }
    return true;
  }

  /// Under tune_config::reproducible: whether trial number `n`'s result at iteration `level` may
  /// be decided on, every earlier trial still running having reported that far (a retried trial
  /// waiting for a group excepted, and everything once the experiment stops).
  bool turn_of(std::size_t n, std::int64_t level) const {
    if (stopping_ || !preempted_.empty()) return true;
    for (auto const& id : order_) {
      auto const j = trial_number(id).value_or(0);
      if (j >= n) continue;
      auto const& t = trials_.at(id);
      if (t.status != "RUNNING") continue;
      auto const reached = t.history.empty() ? std::int64_t{0} : t.history.back().value("training_iteration", std::int64_t{0});
      if (reached < level) return false;
    }
    return true;
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
  std::map<std::string, trial_state> trials_;
  std::vector<std::string> order_;       ///< trial ids in creation order
  std::deque<std::string> queue_, paused_;
  std::set<std::string> unlisted_;  ///< on restore: directories the state does not list, until suggested again
  std::set<std::string> stop_when_paused_, resume_when_paused_;  ///< decided while the trial was still pausing
  std::set<std::string> exploit_when_paused_;  ///< the same, for a restart from a donor (cloned: trial_state::exploit)
  std::set<std::string> failed_by_tuner_;  ///< trials the scheduler failed on: their error is not retried
  /// tune_config::reproducible: results held for their turn, by trial number; the searcher's
  /// events not handed over yet, by trial number; the trials below told_upto_ handed over.
  std::map<std::size_t, nlohmann::json> held_;
  std::map<std::size_t, std::vector<std::pair<searcher_event, nlohmann::json>>> searcher_events_;
  std::size_t told_upto_ = 0;
  std::size_t next_ = 0, running_ = 0, clones_ = 0;
  bool exhausted_ = false, stopping_ = false, dirty_ = true, restored_ = false;
  std::string fatal_, preempted_;
  report::callback_runner* callbacks_ = nullptr;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace cohort::tuning::detail
