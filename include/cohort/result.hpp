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

/// checkpoint_info as JSON, {"path", "metrics"}: the entries of checkpointing::summary and of the
/// result the trainers send the validator ranks.
inline void to_json(nlohmann::json& j, checkpoint_info const& c) { j = {{"path", c.path.string()}, {"metrics", c.metrics}}; }
inline void from_json(nlohmann::json const& j, checkpoint_info& c) { c = {j.at("path").get<std::string>(), j.at("metrics")}; }

namespace detail {
struct no_return {};
}  // namespace detail

/// What `trainer::fit` returns: the same on every rank of the trainer's communicator (validator
/// ranks included, return_values aside).
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
  /// The functor's return value from every training rank, in rank order (empty when the run
  /// failed, and on validator ranks: run_config::validators).
  std::vector<std::conditional_t<std::is_void_v<Return>, detail::no_return, Return>> return_values;
  std::optional<checkpoint_info> checkpoint;           ///< latest committed checkpoint (checkpointing layer)
  std::vector<checkpoint_info> best_checkpoints;       ///< retained checkpoints, best first (checkpointing layer)

  /// True when the run finished without error.
  bool ok() const { return !error.has_value(); }
};

namespace detail {

/// A result as JSON without its return values: what rank 0 of the trainers sends the validator
/// ranks (run_config::validators) at the end of fit().
template <class Return>
nlohmann::json result_to_json(result<Return> const& r) {
  nlohmann::json j{{"metrics", r.metrics}, {"metrics_history", r.metrics_history}, {"path", r.path.string()},
                   {"preempted", r.preempted}, {"best_checkpoints", r.best_checkpoints}};
  if (r.error) j["error"] = *r.error;
  if (r.stopped) j["stopped"] = *r.stopped;
  if (r.checkpoint) j["checkpoint"] = *r.checkpoint;
  return j;
}

/// The inverse of result_to_json; return_values stay empty.
template <class Return>
result<Return> result_from_json(nlohmann::json const& j) {
  result<Return> r;
  r.metrics = j["metrics"];
  for (auto const& row : j["metrics_history"]) r.metrics_history.push_back(row);
  r.path = j["path"].get<std::string>();
  r.preempted = j["preempted"].get<bool>();
  if (j.contains("error")) r.error = j["error"].get<std::string>();
  if (j.contains("stopped")) r.stopped = j["stopped"].get<std::string>();
  if (j.contains("checkpoint")) r.checkpoint = j["checkpoint"].get<checkpoint_info>();
  r.best_checkpoints = j["best_checkpoints"].get<std::vector<checkpoint_info>>();
  return r;
}

}  // namespace detail

}  // namespace cohort
