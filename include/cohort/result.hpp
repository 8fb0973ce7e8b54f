#pragma once
/// \file
/// cohort::result: what fit() returns, identical on every rank.

#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort {

/// A committed checkpoint as the result lists it (filled by the checkpointing layer).
struct checkpoint_info {
  std::filesystem::path path{};  ///< the checkpoint directory
  nlohmann::json metrics{};    ///< metrics of the report that carried it
};

namespace detail {
struct no_return {};
}  // namespace detail

/// What `trainer::fit` returns: the same on every rank of the trainer's communicator.
/// `Return` is the functor's return type (`void` gives no `return_values`).
template <class Return>
struct result {
  nlohmann::json metrics = nlohmann::json::object();  ///< the last report (with auto-filled keys)
  std::vector<nlohmann::json> metrics_history;         ///< every report, in order (under a tuner: the last; the tuner keeps the rest)
  std::filesystem::path path;                          ///< the run directory
  std::optional<std::string> error;                    ///< set when the run failed: one line, cause and fix
  bool preempted = false;
  /// Set when a tuner ended the run early, after a report: "stop", "pause", "exploit" or "preempt".
  std::optional<std::string> stopped;  ///< stopped by SIGTERM/SIGINT after committing; exit with exit_code_preempted
  /// The functor's return value from every rank, in rank order (empty when the run failed).
  std::vector<std::conditional_t<std::is_void_v<Return>, detail::no_return, Return>> return_values;
  std::optional<checkpoint_info> checkpoint;           ///< latest committed checkpoint (checkpointing layer)
  std::vector<checkpoint_info> best_checkpoints;       ///< retained checkpoints, best first (checkpointing layer)

  /// True when the run finished without error.
  bool ok() const { return !error.has_value(); }
};

}  // namespace cohort
