#pragma once
// What the tuning examples do with a finished experiment.

#include <cohort/tuning/tuner.hpp>

#include <mpi.h>

#include <cstdio>
#include <iostream>
#include <limits>
#include <string>

/// The exit code of a tuning example: 75 when preempted (rerun with the same --name to resume),
/// 1 when the experiment failed, or when the best trial's metric does not beat the worst's by at
/// least `min_spread` (the examples' --min-spread: a check that the search told its configs
/// apart), else 0 after rank 0 printed the best trial's metrics, config, trial count, the worst
/// trial's metric and the experiment path as one JSON line.
inline int finish_tuning(cohort::tuning::result_grid const& grid,
                         double min_spread = -std::numeric_limits<double>::infinity()) {
  if (grid.preempted) return cohort::exit_code_preempted;
  if (!grid.ok()) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Every rank holds the same grid, so every rank decides alike and names the cause.
  auto by_worst = grid.objective;
  by_worst.mode = by_worst.mode == cohort::order::max ? cohort::order::min : cohort::order::max;
  cohort::tuning::trial_result const* best_trial = nullptr;
  cohort::tuning::trial_result const* worst_trial = nullptr;
  try {  // no trial reported the metric (every one failed, say): an error, not std::terminate
    best_trial = &grid.best_result();
    worst_trial = &grid.best_result(by_worst);
  } catch (cohort::error const& e) {
    std::fprintf(stderr, "[cohort] rank %d: error: %s\n", rank, e.what());
    return 1;
  }
  auto const& best = *best_trial;
  auto const& worst = *worst_trial;
  double const best_score = best.score(grid.objective), worst_score = worst.score(grid.objective);
  double const spread = grid.objective.mode == cohort::order::max ? best_score - worst_score : worst_score - best_score;
  if (!(spread >= min_spread)) {
    std::fprintf(stderr,
                 "[cohort] rank %d: error: the best trial's %s (%g, %s) beats the worst's (%g, %s) by %g, less than "
                 "--min-spread %g: the search did not tell its configs apart (train longer, on more images, or "
                 "over a wider space)\n",
                 rank, grid.objective.metric.c_str(), best_score, best.id.c_str(), worst_score, worst.id.c_str(), spread,
                 min_spread);
    return 1;
  }
  if (rank == 0) {
    nlohmann::json out = best.metrics;
    out["trial"] = best.id;
    out["config"] = best.config;
    out["trials"] = grid.size();
    out["worst_" + grid.objective.metric] = worst_score;
    out["experiment"] = grid.path.string();
    std::cout << out.dump() << std::endl;
  }
  return 0;
}
