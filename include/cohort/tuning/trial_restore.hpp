#pragma once
/// \file
/// Trials that go on from where they were: an interrupted experiment's trials put back into the
/// roster by the restore options (tune_config's resume_unfinished, resume_errored,
/// restart_errored, as Ray's Tuner.restore), and a trial that failed rerun from its latest
/// committed checkpoint (tune_config::max_failures), its results after it dropped.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/trial_directories.hpp"
#include "cohort/tuning/trial_roster.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

/// Before trial `t` of the experiment in `exp` goes on from its latest committed checkpoint: the
/// results it reported after that checkpoint leave its history, as the rerun reports them again
/// (all of them when it has none; none when it starts from a PBT donor's clone). Returns its
/// committed checkpoints.
inline std::vector<std::filesystem::path> drop_rows_after_checkpoint(std::filesystem::path const& exp, trial_state& t) {
  std::int64_t from = 0;  // the iteration it resumes after
  auto kept = checkpointing::committed(exp / t.id);
  if (!kept.empty()) from = cohort::checkpoint::from_directory(kept.back()).metadata().value("training_iteration", std::int64_t{0});
  else if (!t.restore_from.empty()) from = -1;  // a PBT clone of another trial's checkpoint: its rows stay
  if (from >= 0)
    std::erase_if(t.history, [&](auto const& row) { return row.value("training_iteration", std::int64_t{0}) > from; });
  return kept;
}

/// Trial `t` of the experiment in `exp`, whose functor threw (`why`) and may run again (its
/// t.failures counted, `max_failures` allowed: tune_config::max_failures): queued first in
/// `roster` to go on from its latest committed checkpoint, its results after it dropped, with a
/// line on stderr saying which failure it was and where it goes on from.
inline void rerun_from_checkpoint(trial_state& t, std::string const& why, int max_failures, std::filesystem::path const& exp,
                                  trial_roster& roster) {
  auto const kept = drop_rows_after_checkpoint(exp, t);
  auto const from = !kept.empty() ? kept.back().filename().string()
                    : t.restore_from.empty() ? std::string("the start")
                                             : t.restore_from;
  std::cerr << "[cohort] " + t.id + " failed (failure " + std::to_string(t.failures) +
                   (max_failures < 0 ? std::string{} : " of at most " + std::to_string(max_failures) + " retried") +
                   "): " + why + "; it runs again from " + from + "\n"
            << std::flush;
  roster.queue_first(t);
}

/// What restore_trials() left for the book to tell the searcher and scheduler.
struct restored_trials {
  std::vector<std::string> ended;     ///< unfinished trials not resumed (resume_unfinished off): to terminate
  std::vector<std::string> rejoined;  ///< ERROR trials that go on (resume_errored, restart_errored)
};

/// The trials of an interrupted experiment in `exp`, read from its state file, into `roster`
/// with their histories (their own result.json): RUNNING and PENDING ones queued, PAUSED ones
/// paused, ERROR ones queued again from their latest checkpoint (resume_errored) or from
/// scratch in a fresh directory, the old one set aside (restart_errored).
inline restored_trials restore_trials(std::vector<trial_state> trials, tune_config const& cfg,
                                      std::filesystem::path const& exp, trial_roster& roster) {
  restored_trials out;
  for (auto& t : trials) {
    bool const unfinished = t.status == "RUNNING" || t.status == "PENDING" || t.status == "PAUSED";
    bool const errored_again = t.status == "ERROR" && (cfg.resume_errored || cfg.restart_errored);
    if (errored_again && cfg.restart_errored) {
      set_aside(exp, t.id, ".restarted_");  // kept, not deleted: it starts over in a fresh directory
      t.saved_last = nlohmann::json::object();
      t.restore_from.clear();
    }
    t.history = read_result_rows(exp / t.id);
    if (errored_again) drop_rows_after_checkpoint(exp, t);
    auto const status = t.status;
    auto& added = roster.add(std::move(t));
    if (unfinished && !cfg.resume_unfinished) {
      out.ended.push_back(added.id);
    } else if (status == "RUNNING" || status == "PENDING" || errored_again) {
      if (errored_again) out.rejoined.push_back(added.id);
      added.error.clear();
      roster.queue_last(added);
    } else if (status == "PAUSED") {
      roster.pause(added);
    }
  }
  return out;
}

}  // namespace cohort::tuning::detail
