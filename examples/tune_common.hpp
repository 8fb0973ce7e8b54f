#pragma once
// What the tuning examples do with a finished experiment.

#include <cohort/tuning/tuner.hpp>

#include <iostream>

/// The exit code of a tuning example: 75 when preempted (rerun with the same --name to resume),
/// 1 when the experiment failed, else 0 after rank 0 printed the best trial's metrics, config,
/// trial count and experiment path as one JSON line.
inline int finish_tuning(cohort::tuning::result_grid const& grid) {
  if (grid.preempted) return cohort::exit_code_preempted;
  if (!grid.ok()) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    auto const& best = grid.best_result();
    nlohmann::json out = best.metrics;
    out["trial"] = best.id;
    out["config"] = best.config;
    out["trials"] = grid.size();
    out["experiment"] = grid.path.string();
    std::cout << out.dump() << std::endl;
  }
  return 0;
}
