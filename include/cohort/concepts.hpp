#pragma once
/// \file
/// One concept per policy axis. Every policy cohort ships is checked against its concept with a
/// static_assert below; a user's policy that breaks one is a compile error naming the concept.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/checkpointing/policies.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cuda.hpp"
#include "cohort/sharding/policies.hpp"
#include "cohort/tuning/decision.hpp"

namespace cohort::tuning {
struct space;
}  // namespace cohort::tuning

namespace cohort {

/// Scaling: validates the communicator size, and places each rank (device, threads).
template <class P>
concept scaling_policy = std::copyable<P> && requires(P const& p, scaling::topology const& t, int n) {
  { p.check(n) } -> std::same_as<std::optional<std::string>>;
  { p.device_for(t) } -> std::same_as<device>;
  { p.intra_op_threads(t, n) } -> std::same_as<int>;
};

/// Sharding: the sample indices of one rank in one epoch, a pure function of
/// (dataset size, world size, rank, epoch).
template <class P>
concept sharding_policy = std::copyable<P> && requires(P const& p, std::size_t n, int w, std::int64_t e) {
  { p.indices(n, w, w, e) } -> std::same_as<std::vector<std::size_t>>;
};

/// Checkpointing: which of the reported checkpoints (oldest first) to keep.
template <class P>
concept checkpointing_policy = std::copyable<P> && requires(P const& p, std::span<checkpointing::record const> s) {
  { p.retain(s) } -> std::same_as<std::vector<std::size_t>>;
};

/// Tuning, search: proposes trial configs from a search space. `setup` is called once with the
/// space, the objective and num_samples; `suggest` returns the next config, or nothing once the
/// searcher has proposed all it will; `on_trial_complete` gets a trial's last result (null if it
/// failed). Its state round-trips through JSON so an interrupted experiment resumes the search.
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
/// or (PBT) exploits another trial. A pure function of the results seen so far.
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

static_assert(scaling_policy<scaling::cpu>);
static_assert(scaling_policy<scaling::cuda>);
static_assert(sharding_policy<sharding::contiguous>);
static_assert(sharding_policy<sharding::interleaved>);
static_assert(sharding_policy<sharding::shuffled>);
static_assert(checkpointing_policy<checkpointing::keep_all>);
static_assert(checkpointing_policy<checkpointing::keep_last>);
static_assert(checkpointing_policy<checkpointing::keep_best>);

}  // namespace cohort
