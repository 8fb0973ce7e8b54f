#pragma once
/// \file
/// Where an experiment's new trials come from: its searcher, asked for each trial id in turn and
/// told of the trials' results, pauses and ends (searcher_feed), and, on a restored experiment,
/// the trial directories experiment_state.json does not list (a trial whose directory holds the
/// same config is resumed with its rows when the searcher suggests it again; the others are set
/// aside once the searcher has no more, never deleted).

#include <cstddef>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/trial_directories.hpp"
#include "cohort/tuning/trial_events.hpp"

namespace cohort::tuning::detail {

/// The searcher of the experiment in directory `exp` and the trial numbers it has given out; see
/// the file comment. A searcher that throws is reported to `fail` (the experiment stops).
template <class Searcher>
class trial_source {
 public:
  /// `in_trial_order`: tune_config::reproducible (the searcher's events in trial order).
  trial_source(Searcher searcher, bool in_trial_order, std::filesystem::path exp, std::function<void(std::string const&)> fail)
      : searcher_(std::move(searcher)), exp_(std::move(exp)), fail_(fail), feed_(in_trial_order, std::move(fail)) {}

  /// The searcher itself (its setup, its saved state).
  Searcher& searcher() { return searcher_; }

  /// A restored experiment: the next trial's number, whether the searcher had no more, and the
  /// trial directories its state does not list.
  void restore(std::size_t next, bool exhausted, std::set<std::string> unlisted) {
    next_ = next;
    exhausted_ = exhausted;
    unlisted_ = std::move(unlisted);
  }

  /// The number of the next new trial.
  std::size_t next() const { return next_; }
  /// Whether the searcher has no more trials (or failed).
  bool exhausted() const { return exhausted_; }

  /// Trial trial_id(next()) as the searcher suggests it, with its rows when an unlisted directory
  /// holds the same trial. Nothing when the searcher has none (or failed): call exhaust().
  std::optional<trial_state> suggest() {
    auto candidate = trial_id(next_);
    std::optional<nlohmann::json> config;
    try {
      config = searcher_.suggest(candidate);
    } catch (std::exception const& e) {
      fail_(std::string("the searcher failed: ") + e.what());
    }
    if (!config) return std::nullopt;
    ++next_;
    trial_state t;
    t.id = candidate;
    t.config = std::move(*config);
    if (unlisted_.erase(candidate) > 0) {
      if (same_trial(exp_ / candidate, t.config)) t.history = read_result_rows(exp_ / candidate);  // resumed, its rows kept
      else set_aside_orphan(exp_, candidate);
    }
    return t;
  }

  /// The searcher has no more trials: the unlisted directories are set aside (never suggested again).
  void exhaust() {
    exhausted_ = true;
    for (auto const& id : unlisted_) set_aside_orphan(exp_, id);
    unlisted_.clear();
  }

  /// Tells the searcher of a trial's result, pause or end (at once, or in trial order).
  void tell(trial_state const& t, searcher_event what, nlohmann::json const& row) {
    feed_.tell(searcher_, t.id, trial_number(t.id).value_or(0), what, row);
  }

  /// In trial order: whether every trial numbered below `upto` has ended (`ended(id)`); if so the
  /// searcher hears their events (searcher_feed::catch_up).
  template <class Ended>
  bool caught_up(std::size_t upto, Ended const& ended) {
    return feed_.catch_up(searcher_, upto, ended);
  }

 private:
  Searcher searcher_;
  std::filesystem::path exp_;
  std::function<void(std::string const&)> fail_;
  searcher_feed feed_;
  std::size_t next_ = 0;
  bool exhausted_ = false;
  std::set<std::string> unlisted_;  ///< on restore: directories the state does not list, until suggested again
};

}  // namespace cohort::tuning::detail
