#pragma once
/// \file
/// What the book of trials tells others of its trials, and in what order: the searcher (results,
/// pauses, ends; under tune_config::reproducible in trial order), the trial groups (under
/// tune_config::reproducible, each result's answer in trial order) and rank 0's callbacks
/// (starts, results, committed checkpoints).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/trial_directories.hpp"

namespace cohort::tuning::detail {

/// A trial event as a searcher hears of it.
enum class searcher_event { result, pause, complete };

/// The searcher's events: delivered at once, or (in_trial_order: tune_config::reproducible) kept by
/// trial number until catch_up() hands them over in trial order. A searcher that throws is
/// reported to `fail` (the experiment stops), never to the trial.
class searcher_feed {
 public:
  searcher_feed(bool in_trial_order, std::function<void(std::string const&)> fail)
      : in_trial_order_(in_trial_order), fail_(std::move(fail)) {}

  /// Event `what` of trial `id` (number `n`) with its row.
  template <class Searcher>
  void tell(Searcher& s, std::string const& id, std::size_t n, searcher_event what, nlohmann::json const& row) {
    if (in_trial_order_) {
      kept_[n].emplace_back(what, row);
      return;
    }
    deliver(s, id, what, row);
  }

  /// In trial order: whether every trial numbered below `upto` has ended (`ended(id)`); if so
  /// their events not handed over yet are, in trial order.
  template <class Searcher, class Ended>
  bool catch_up(Searcher& s, std::size_t upto, Ended const& ended) {
    for (std::size_t j = told_upto_; j < upto; ++j)
      if (!ended(trial_id(j))) return false;
    for (; told_upto_ < upto; ++told_upto_) {
      auto ev = kept_.find(told_upto_);
      if (ev == kept_.end()) continue;
      for (auto const& [what, row] : ev->second) deliver(s, trial_id(told_upto_), what, row);
      kept_.erase(ev);
    }
    return true;
  }

 private:
  template <class Searcher>
  void deliver(Searcher& s, std::string const& id, searcher_event what, nlohmann::json const& row) {
    try {
      if (what == searcher_event::complete) {
        s.on_trial_complete(id, row);
      } else if (what == searcher_event::pause) {
        if constexpr (requires { s.on_trial_pause(id, row); }) s.on_trial_pause(id, row);
      } else {
        if constexpr (requires { s.on_trial_result(id, row); }) s.on_trial_result(id, row);
      }
    } catch (std::exception const& e) {
      fail_(e.what());
    }
  }

  bool in_trial_order_;
  std::function<void(std::string const&)> fail_;
  std::map<std::size_t, std::vector<std::pair<searcher_event, nlohmann::json>>> kept_;  ///< by trial number
  std::size_t told_upto_ = 0;  ///< trials below it handed over
};

/// Under tune_config::reproducible: the trials' results ({"trial_id", "row"}) held until their
/// turn comes, then decided in trial order, whatever order they arrived in.
class held_results {
 public:
  /// Holds result `msg` of trial number `n`.
  void hold(std::size_t n, nlohmann::json msg) { held_[n] = std::move(msg); }

  /// The held results whose turn has come (`turn_of(n, iteration)`), in trial order, each with
  /// its answer `decide(msg)`: (trial id, answer). A decision can bring another result's turn:
  /// every result is looked at again after each.
  template <class TurnOf, class Decide>
  std::vector<std::pair<std::string, nlohmann::json>> release(TurnOf const& turn_of, Decide&& decide) {
    std::vector<std::pair<std::string, nlohmann::json>> out;
    for (bool more = true; more;) {
      more = false;
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        if (!turn_of(it->first, it->second.at("row").value("training_iteration", std::int64_t{0}))) continue;
        auto msg = std::move(it->second);
        held_.erase(it);
        auto id = msg.at("trial_id").template get<std::string>();
        out.emplace_back(std::move(id), decide(std::move(msg)));
        more = true;
        break;
      }
    }
    return out;
  }

 private:
  std::map<std::size_t, nlohmann::json> held_;  ///< by trial number
};

/// Rank 0's callbacks (report/callbacks.hpp) as the book tells them of the trials of experiment
/// directory `exp`; a null runner: none.
struct trial_callbacks {
  report::callback_runner* runner = nullptr;
  std::filesystem::path exp{};

  explicit operator bool() const { return runner != nullptr; }

  /// The checkpoint `t` would go on from if it started now: a donor's copy (restore_from), else
  /// its own latest committed one; empty for none (it starts from scratch).
  std::filesystem::path start_point(trial_state const& t) const {
    if (!t.restore_from.empty()) return t.restore_from;
    auto kept = cohort::checkpointing::committed(exp / t.id);
    return kept.empty() ? std::filesystem::path{} : kept.back();
  }

  /// The trial starts, or goes on from checkpoint `from` (start_point, taken when the trial was
  /// handed to its group; empty: from scratch).
  void start(trial_state const& t, std::filesystem::path const& from) const {
    runner->trial_start({.id = t.id, .config = t.config, .path = exp / t.id}, from);
  }

  /// A result, and the checkpoint it committed (sync checkpoints are committed before the result
  /// is sent; async ones are found at the trial's end, checkpoints()).
  void result(trial_state& t) const {
    auto const& row = t.history.back();
    runner->trial_result(t.id, row);
    auto const iteration = row.value("training_iteration", std::int64_t{0});
    auto dir = exp / t.id / checkpointing::dir_name(iteration);
    std::error_code ec;
    if (iteration > t.told_checkpoint && std::filesystem::is_directory(dir, ec)) {
      t.told_checkpoint = iteration;
      runner->checkpoint(t.id, std::move(dir));
    }
  }

  /// The trial ended in ERROR: its checkpoints not told yet, then its error.
  void error(trial_state& t) const {
    checkpoints(t);
    runner->trial_error(t.id, t.error);
  }
  /// The trial ended for good otherwise (TERMINATED): its checkpoints not told yet, then its end.
  void complete(trial_state& t) const {
    checkpoints(t);
    runner->trial_complete(t.id);
  }

  /// The trial's committed checkpoints not told yet (async mode commits after the result).
  void checkpoints(trial_state& t) const {
    for (auto const& dir : cohort::checkpointing::committed(exp / t.id)) {
      auto const iteration = std::stoll(dir.filename().string().substr(11));  // checkpoint_NNNNNN
      if (iteration <= t.told_checkpoint) continue;
      t.told_checkpoint = iteration;
      runner->checkpoint(t.id, dir);
    }
  }
};

}  // namespace cohort::tuning::detail
