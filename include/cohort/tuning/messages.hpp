#pragma once
/// \file
/// The messages between the tuner's group leaders and its coordinator on rank 0: JSON text sent
/// point to point on the tuner's duplicate of MPI_COMM_WORLD, one tag per kind of message, and
/// the trials as one JSON text for the broadcast at the end of an experiment.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/comm/deadline.hpp"
#include "cohort/tuning/result_grid.hpp"

namespace cohort::tuning::detail {

/// Message tags between group leaders and the coordinator (on a duplicate of MPI_COMM_WORLD).
enum tag : int { request_tag = 1, result_tag = 2, complete_tag = 3, reply_tag = 11 };

/// Sends `j` as JSON text to `dest` with `tag`.
inline void send_json(MPI_Comm comm, int dest, int tag, nlohmann::json const& j) {
  auto s = j.dump();
  MPI_Send(s.data(), static_cast<int>(s.size()), MPI_CHAR, dest, tag, comm);
}

/// Receives one JSON text from `source` with `tag` (MPI_ANY_SOURCE/MPI_ANY_TAG allowed) and
/// parses it; `status` receives the sender and tag.
inline nlohmann::json recv_json(MPI_Comm comm, int source, int tag, MPI_Status* status = nullptr) {
  MPI_Status st;
  // Polled, not MPI_Probe: Open MPI's blocking probe spins on a core, and a leader waiting for
  // the coordinator's answer would take that core from rank 0's coordinator thread, which has
  // to run for the answer to come (bench_tune trials/N, results/N at 2 ranks on 2 cores).
  int flag = 0;
  for (int polls = 0;; ++polls) {
    MPI_Iprobe(source, tag, comm, &flag, &st);
    if (flag) break;
    if (polls < 20) std::this_thread::yield();
    else comm::detail::precise_sleep(std::chrono::microseconds(20));
  }
  int n = 0;
  MPI_Get_count(&st, MPI_CHAR, &n);
  std::string s(static_cast<std::size_t>(n), '\0');
  MPI_Recv(s.data(), n, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
  if (status) *status = st;
  return nlohmann::json::parse(s);
}

/// The trials as a JSON array, each history row dumped straight into the text.
inline std::string encode_trials(std::vector<tuning::trial_result> const& trials) {
  std::string text = "[";
  for (std::size_t i = 0; i < trials.size(); ++i) {
    auto const& t = trials[i];
    nlohmann::json head{{"id", t.id}, {"status", t.status}, {"config", t.config}, {"metrics", t.metrics}, {"path", t.path.string()},
                        {"checkpoints", t.checkpoints}, {"num_failures", t.num_failures}};
    if (t.error) head["error"] = *t.error;
    text += i ? ",{" : "{";
    auto h = head.dump();
    text.append(h, 1, h.size() - 2);  // the members, without the braces
    text += ",\"history\":[";
    for (std::size_t k = 0; k < t.metrics_history.size(); ++k) {
      if (k) text += ',';
      text += t.metrics_history[k].dump();
    }
    text += "]}";
  }
  return text + "]";
}

}  // namespace cohort::tuning::detail
