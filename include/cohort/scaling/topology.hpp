#pragma once
/// \file
/// Where each rank sits: node and local rank, computed from every rank's host name.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "cohort/comm/collectives.hpp"

namespace cohort::scaling {

/// Placement of one rank in a communicator.
struct topology {
  int world_rank = 0;        ///< rank in the trainer's communicator
  int world_size = 1;        ///< ranks in the trainer's communicator
  int local_rank = 0;        ///< rank among the ranks on this node
  int local_world_size = 1;  ///< ranks on this node
  int node_rank = 0;         ///< index of this node, in order of first appearance by rank
  int num_nodes = 1;         ///< nodes in the communicator
  /// This rank's index among every rank of the job on its node, whatever communicator the
  /// trainer runs on: the tuner's trial groups share a node, and this is what gives each of
  /// their ranks a GPU of its own. local_rank where only the communicator is known.
  int job_local_rank = 0;
  int job_local_size = 1;  ///< ranks of the whole job on this node (local_world_size where unknown)
};

/// Pure: the topology of `rank` given every rank's host name (in rank order). Nodes are numbered
/// by the lowest rank they hold; local ranks follow global rank order within a node. The job-wide
/// fields are the communicator's (the trainer sets them from the job when it knows it).
inline topology topology_from_hosts(std::vector<std::string> const& hosts, int rank) {
  topology t;
  t.world_rank = rank;
  t.world_size = static_cast<int>(hosts.size());
  std::vector<std::string> nodes;
  for (auto const& h : hosts)
    if (std::find(nodes.begin(), nodes.end(), h) == nodes.end()) nodes.push_back(h);
  auto const& mine = hosts.at(static_cast<std::size_t>(rank));
  t.num_nodes = static_cast<int>(nodes.size());
  t.node_rank = static_cast<int>(std::find(nodes.begin(), nodes.end(), mine) - nodes.begin());
  t.local_rank = 0;
  t.local_world_size = 0;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r] != mine) continue;
    if (static_cast<int>(r) < rank) ++t.local_rank;
    ++t.local_world_size;
  }
  t.job_local_rank = t.local_rank;
  t.job_local_size = t.local_world_size;
  return t;
}

/// This rank's topology in `comm`. Cost: two allgathers of host names (control path only).
template <comm::communicator C>
topology discover_topology(C& comm, std::string const& host_name) {
  return topology_from_hosts(comm::allgather_strings(comm, host_name), comm.rank());
}

}  // namespace cohort::scaling
