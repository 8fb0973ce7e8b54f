#pragma once
/// \file
/// Trials that stop or start again on the scheduler's word rather than their own results: PBT's
/// exploits (a donor's latest checkpoint cloned into the trial's directory, the trial continuing
/// from it with a new config), and a directing scheduler's decisions about paused trials
/// (HyperBand, synchronous PBT), kept for a trial still pausing until its pause is committed.

#include <cstddef>
#include <filesystem>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/trial_directories.hpp"
#include "cohort/tuning/trial_roster.hpp"

namespace cohort::tuning::detail {

/// What becomes of a trial once its pause is committed.
enum class after_pause { stay_paused, stop, resume, from_donor };

/// The exploits and paused-trial decisions of the experiment in directory `exp`; see the file
/// comment. Owns the count of checkpoint clones (their names' numbers).
class trial_restarts {
 public:
  explicit trial_restarts(std::filesystem::path exp) : exp_(std::move(exp)) {}

  /// Exploit decision `d` for trial `t`: the donor's latest checkpoint cloned into t's directory,
  /// kept in t.exploit with the config to continue with (`d.config`, else the donor's). False
  /// when the donor has no committed checkpoint yet: t keeps its own config.
  bool clone_donor(trial_state& t, scheduling_decision d, trial_roster const& roster) {
    auto clone = clone_checkpoint(exp_, d.donor, t.id, clones_);
    if (!clone) return false;
    if (d.config.is_null()) d.config = roster.at(d.donor).config;
    t.exploit = std::move(d);
    t.exploit->donor = *clone;
    return true;
  }

  /// Trial `t` continues from the donor's checkpoint cloned for it, with the new config: its own
  /// checkpoints are superseded and it is queued first.
  void continue_from_donor(trial_state& t, trial_roster& roster) {
    supersede_checkpoints(exp_ / t.id, clones_);
    t.config = t.exploit->config;
    t.restore_from = t.exploit->donor;
    t.exploit.reset();
    roster.queue_first(t);
  }

  /// A directing scheduler's decisions about paused trials: a waiting trial (paused, or queued
  /// because it was pausing when the experiment was interrupted) stops (`terminate(t)`), is
  /// queued again, or continues from a donor at once; a trial still pausing (RUNNING) does so
  /// once its pause is committed (take()). `readd(t)`: a restart whose donor has no checkpoint
  /// yet, the trial keeping its config. Returns whether anything was decided.
  template <class Terminate, class Readd>
  bool apply(paused_decisions d, trial_roster& roster, Terminate&& terminate, Readd&& readd) {
    using line = trial_roster::line;
    for (auto const& id : d.stop) {
      auto* t = roster.find(id);
      if (!t) continue;
      if (roster.take_out(id) != line::none) terminate(*t);
      else if (t->status == "RUNNING") stop_.insert(id);
    }
    for (auto& [id, exploit] : d.exploit) {
      auto* t = roster.find(id);
      if (!t) continue;
      bool const cloned = clone_donor(*t, std::move(exploit), roster);
      if (!cloned) readd(*t);
      if (roster.take_out(id) == line::none) {
        if (t->status == "RUNNING") (cloned ? exploit_ : resume_).insert(id);
        continue;
      }
      if (cloned) continue_from_donor(*t, roster);
      else roster.queue_last(*t);
    }
    for (auto const& id : d.resume) {
      auto* t = roster.find(id);
      if (!t) continue;
      if (t->status == "PAUSED" && roster.take_out(id) == line::paused) roster.queue_last(*t);
      else if (t->status == "RUNNING") resume_.insert(id);
    }
    return !d.stop.empty() || !d.resume.empty() || !d.exploit.empty();
  }

  /// What trial `id`'s pause, now committed, becomes; the decision is forgotten.
  after_pause take(std::string const& id) {
    if (stop_.erase(id)) return after_pause::stop;
    if (exploit_.erase(id)) return after_pause::from_donor;  // the donor's checkpoint was cloned when decided
    if (resume_.erase(id)) return after_pause::resume;
    return after_pause::stay_paused;
  }

  /// Trial `t` ended otherwise than paused: decisions about its pause are forgotten, a restart
  /// from a donor's clone with them.
  void forget(trial_state& t) {
    stop_.erase(t.id);
    resume_.erase(t.id);
    if (exploit_.erase(t.id)) t.exploit.reset();
  }

 private:
  std::filesystem::path exp_;
  std::size_t clones_ = 0;
  std::set<std::string> stop_, resume_;  ///< decided while the trial was still pausing
  std::set<std::string> exploit_;        ///< the same, for a restart from a donor (cloned: trial_state::exploit)
};

}  // namespace cohort::tuning::detail
