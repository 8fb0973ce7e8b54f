#pragma once
/// \file
/// How a trainer's run ends on every rank: the functor's outcome held until every rank has
/// finished, a failed rank telling the others (or aborting the job rather than hang), the
/// completion agreed (failures, report counts), and the results gathered identically everywhere.

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/resume.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/report/protocol.hpp"
#include "cohort/result.hpp"

namespace cohort::detail::trainer {

/// How the functor's call ended on this rank: its value, or the failure it is held with until
/// every rank has finished (`secondary`: another rank failed, and its error is the one
/// reported), a SIGTERM/SIGINT, or the tuner's stop.
template <class Return>
struct outcome {
  std::optional<std::conditional_t<std::is_void_v<Return>, no_return, Return>> value;
  std::optional<std::string> failure;
  bool secondary = false;
  bool preempted = false;
  std::optional<std::string> stopped;
};

/// A rank that failed on its own tells the others at their next agreement point; it waits at
/// most `abort_timeout_ms` for them to get there, then aborts the job rather than hang.
inline void tell_the_others(lockstep& steps, std::string const& failure, int abort_timeout_ms, int rank) {
  auto settle = [&] {  // the agreement in flight, waited for at most abort_timeout_ms
    comm::detail::wait_or_abort([&] { return steps.test(); }, abort_timeout_ms, rank, failure);
    try {
      steps.finish();
    } catch (diverged const&) {  // the others were elsewhere: they now stop too
    }
  };
  if (steps.pending()) settle();  // one the functor left started (a backward that threw)
  if (!steps.broken()) {
    steps.start(step::failed);
    settle();
  }
}

/// Completion, agreed over `control`: [failed (2: its own error, 1: another rank's), max
/// reports, -min reports]. Returns the run's error: the errors of the ranks that failed on
/// their own (the others only say they stopped), or report counts that differ. A failed rank
/// waits at most `abort_timeout_ms` for the others, then aborts the job rather than hang.
template <class Return>
std::optional<std::string> complete(comm::any& control, report::protocol& reports, outcome<Return> const& ran, int abort_timeout_ms) {
  auto const& failure = ran.failure;
  std::int64_t status[3] = {failure ? (ran.secondary ? 1 : 2) : 0, reports.rows().reports_this_attempt(),
                            -reports.rows().reports_this_attempt()};
  auto req = control.iallreduce(status, 3, comm::reduce_op::max);
  // The progress lines before any error or result. They share a thread with async checkpoint
  // writes, so after a failure a write may still be in flight: the completion is tested (and
  // so progresses) meanwhile, and the other ranks' abort_timeout_ms does not run out on it.
  bool completed = false;
  if (reports.rows().has_console())
    while (!reports.worker().wait_for(std::chrono::milliseconds(1))) completed = completed || req.test();
  if (!completed && failure) comm::detail::wait_or_abort([&] { return req.test(); }, abort_timeout_ms, control.rank(), *failure);
  else if (!completed) req.wait();
  if (status[0] != 0) return comm::agree_on_error(control, status[0] == 2 && ran.secondary ? std::nullopt : failure);
  if (status[1] != -status[2])
    return "report() was called " + std::to_string(-status[2]) + " times on some rank and " + std::to_string(status[1]) +
           " on another: every rank must call report() the same number of times";
  return std::nullopt;
}

/// The results, identical on every rank: the metrics (under a tuner the history is the
/// tuner's, in its result_grid, and only the last report comes back), the latest and the
/// retained checkpoints, and every rank's return value.
template <class Return, class Checkpointing>
void collect_results(result<Return>& out, comm::any& control, report::protocol& reports, outcome<Return>& ran,
                     Checkpointing const& policy) {
  int const rank = control.rank();
  // Rank 0's value on every rank: sent as JSON text and read back on every rank of a larger group
  // (a NaN is null on each); a one-rank group keeps it as it is.
  auto share = [&](nlohmann::json value) {
    if (control.size() == 1) return value;
    return nlohmann::json::parse(comm::broadcast_string(control, rank == 0 ? value.dump() : std::string{}));
  };
  nlohmann::json history = nlohmann::json::array();
  if (rank == 0) {
    auto const& rows = reports.rows().history();
    if (!reports.under_tuner()) history = rows;
    else if (!rows.empty()) history.push_back(rows.back());
  }
  for (auto& row : share(std::move(history))) out.metrics_history.push_back(std::move(row));
  if (!out.metrics_history.empty()) out.metrics = out.metrics_history.back();
  if (rank == 0) reports.checkpoints().finish_validation();
  auto ckpts = share(rank == 0 ? cohort::checkpointing::summary(reports.checkpoints(), policy) : nlohmann::json{});
  out.best_checkpoints = ckpts["best"].template get<std::vector<checkpoint_info>>();
  if (ckpts.contains("latest")) out.checkpoint = ckpts["latest"].template get<checkpoint_info>();
  if (out.stopped) {
    // Ended by the tuner on every rank at the same report: the functor returned nothing.
  } else if constexpr (std::is_void_v<Return>) {
    out.return_values.resize(static_cast<std::size_t>(control.size()));
  } else {
    auto all = comm::allgather_strings(control, nlohmann::json(*ran.value).dump());
    for (auto const& s : all) out.return_values.push_back(nlohmann::json::parse(s).template get<Return>());
  }
}

/// `out` with `message` as its error, said on this rank's stderr.
template <class R>
R fail_run(R out, std::string const& message, int rank) {
  // One write per line, so that lines from different ranks do not interleave.
  std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + message + "\n") << std::flush;
  out.error = message;
  return out;
}

}  // namespace cohort::detail::trainer
