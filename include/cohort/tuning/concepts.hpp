#pragma once
/// \file
/// The concepts of the tuning axis: searcher, scheduler, stopper (the trainer's axes are in
/// concepts.hpp). Each policy cohort ships static_asserts its concept where it is defined.

#include <concepts>
#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/tuning/decision.hpp"

namespace cohort::tuning {
struct space;

/// The shipped policies, one folder each: searchers (tuning/search/), schedulers
/// (tuning/schedule/), stoppers (tuning/stop/).
namespace search {}
namespace schedule {}
namespace stop {}
}  // namespace cohort::tuning

namespace cohort {
/// The short names users write: `cohort::search::tpe`, `cohort::schedule::asha`,
/// `cohort::stop::plateau`.
namespace search = tuning::search;
namespace schedule = tuning::schedule;
namespace stop = tuning::stop;
}  // namespace cohort

namespace cohort {

/// Tuning, search: proposes trial configs from a search space. `setup` is called once with the
/// space, the objective and num_samples; `suggest` returns the next config, or nothing once the
/// searcher has proposed all it will; `on_trial_complete` gets a trial's last result (null if it
/// failed). Its state round-trips through JSON so an interrupted experiment resumes the search.
/// A searcher may also have `on_trial_result(id, result)`, called with every result, and
/// `on_trial_pause(id, last_result)` (Ray's on_pause), called when a trial pauses (HyperBand's
/// milestones): search::bohb observes results there.
template <class S>
concept searcher = std::movable<S> && requires(S& s, S const& cs, tuning::space const& sp, tuning::objective const& o,
                                               std::string const& id, nlohmann::json const& j, std::size_t n) {
  s.setup(sp, o, n);
  { s.suggest(id) } -> std::same_as<std::optional<nlohmann::json>>;
  s.on_trial_complete(id, j);
  { cs.save_state() } -> std::same_as<nlohmann::json>;
  s.restore_state(j);
};

/// Tuning, scheduling: decides after every reported result whether a trial goes on, stops, pauses
/// or (PBT) exploits another trial. A pure function of the results seen so far. A scheduler may
/// also have `proceeds(id)`, the tuning::proceed_span of the trial's results it is sure to answer
/// `proceed`: the tuner then sends those without waiting for the answer (schedule::fifo, asha).
template <class S>
concept scheduler = std::movable<S> && requires(S& s, S const& cs, tuning::objective const& o, std::string const& id,
                                                nlohmann::json const& j) {
  s.setup(o);
  s.on_trial_add(id, j);
  { s.on_trial_result(id, j) } -> std::same_as<tuning::scheduling_decision>;
  s.on_trial_complete(id, j);
  { cs.save_state() } -> std::same_as<nlohmann::json>;
  s.restore_state(j);
};

/// Tuning, stopping: ends a trial (`stop_trial`, given each result) or the whole experiment
/// (`stop_all`, given the seconds since it started). Several stoppers combine with "or".
template <class S>
concept stopper = std::copyable<S> && requires(S& s, std::string const& id, nlohmann::json const& j, double t) {
  { s.stop_trial(id, j) } -> std::same_as<bool>;
  { s.stop_all(t) } -> std::same_as<bool>;
};

}  // namespace cohort
