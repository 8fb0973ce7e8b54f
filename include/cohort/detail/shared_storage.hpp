#pragma once
/// \file
/// On several hosts, storage_path must be one file system every host sees: each rank writes its
/// part of a checkpoint there and reads the checkpoint back on resume. Checked once at setup, so a
/// folder that only rank 0's host has is an error before training, not a half-written checkpoint.

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/collectives.hpp"
#include "cohort/comm/communicator.hpp"

namespace cohort::detail {

/// Pure: the error when the ranks whose entry in `sees` is false cannot see what rank 0 wrote in
/// `run_path`; nothing when every rank can. `hosts[r]` is rank r's host name.
inline std::optional<std::string> unshared_storage_error(std::vector<bool> const& sees, std::vector<std::string> const& hosts,
                                                         std::filesystem::path const& run_path) {
  std::string blind;
  std::size_t count = 0;
  for (std::size_t r = 0; r < sees.size(); ++r) {
    if (sees[r]) continue;
    if (++count <= 8) blind += (blind.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " on " + hosts[r]);
  }
  if (count == 0) return std::nullopt;
  if (count > 8) blind += " and " + std::to_string(count - 8) + " more";
  return "storage_path is not shared by every host: " + blind + " cannot see the run directory " + run_path.string() +
         " that rank 0 made on " + hosts.front() +
         ": set run_config.storage_path to a folder every host mounts (NFS or a parallel file system)";
}

/// Collective over `comm`: an error (the same on every rank) when some rank cannot read a file
/// rank 0 has just written in `run_path` (it waits up to `wait_ms` for it to show, as a network
/// file system may take a moment). `hosts`: every rank's host name, in rank order (as the
/// topology gathered them), for the error. Cost: one file written and removed by rank 0, one
/// lookup per rank, a broadcast and an allgather of one byte per rank.
template <comm::communicator C>
std::optional<std::string> check_shared_storage(C& comm, std::filesystem::path const& run_path,
                                                std::vector<std::string> const& hosts, int wait_ms = 2000) {
  std::string token;  // rank 0: the file's name and content, or "!" and why it could not write it
  if (comm.rank() == 0) {
    std::ostringstream t;
    t << ::getpid() << '_' << std::chrono::steady_clock::now().time_since_epoch().count();
    token = t.str();
    std::ofstream out(run_path / (".cohort_storage_check_" + token));
    out << token;
    out.close();
    if (!out)
      token = "!cannot write a file in the run directory " + run_path.string() +
              " on rank 0: check that storage_path is writable and has free space";
  }
  token = comm::broadcast_string(comm, token);
  if (token.front() == '!') return token.substr(1);
  auto const file = run_path / (".cohort_storage_check_" + token);
  bool sees = false;
  for (auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);;) {
    std::string got;
    if (std::ifstream in{file}; in >> got) sees = got == token;
    if (sees || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto const flags = comm::allgather_strings(comm, sees ? "1" : "0");
  if (comm.rank() == 0) {
    std::error_code ec;
    std::filesystem::remove(file, ec);
  }
  std::vector<bool> seen;
  for (auto const& f : flags) seen.push_back(f == "1");
  return unshared_storage_error(seen, hosts, run_path);
}

}  // namespace cohort::detail
