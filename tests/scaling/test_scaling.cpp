#include <cohort/concepts.hpp>
#include <cohort/scaling/cpu.hpp>
#include <cohort/scaling/topology.hpp>

#include "../catch.hpp"

using cohort::scaling::topology_from_hosts;

TEST_CASE("topology numbers nodes by first rank and local ranks within a node", "[scaling][pure]") {
  std::vector<std::string> hosts{"a", "b", "a", "c", "b", "a"};
  auto t = topology_from_hosts(hosts, 4);
  CHECK(t.world_rank == 4);
  CHECK(t.world_size == 6);
  CHECK(t.node_rank == 1);
  CHECK(t.local_rank == 1);
  CHECK(t.local_world_size == 2);
  CHECK(t.num_nodes == 3);
  auto a = topology_from_hosts(hosts, 5);
  CHECK(a.node_rank == 0);
  CHECK(a.local_rank == 2);
  CHECK(a.local_world_size == 3);
}

TEST_CASE("scaling::cpu accepts the launched rank count and rejects another", "[scaling][pure]") {
  STATIC_REQUIRE(cohort::scaling_policy<cohort::scaling::cpu>);
  CHECK_FALSE(cohort::scaling::cpu{}.check(3).has_value());
  CHECK_FALSE(cohort::scaling::cpu{.num_workers = 3}.check(3).has_value());
  auto e = cohort::scaling::cpu{.num_workers = 4}.check(2);
  REQUIRE(e.has_value());
  CHECK(e->find("mpirun -np 4") != std::string::npos);
  CHECK(e->find("job has 2 ranks") != std::string::npos);
  CHECK(cohort::scaling::cpu{.num_workers = -1}.check(2).has_value());
}

TEST_CASE("intra-op threads default to the cores per local rank", "[scaling][pure]") {
  auto t = topology_from_hosts({"a", "a", "a", "b"}, 0);
  CHECK(cohort::scaling::cpu{}.intra_op_threads(t, 12) == 4);
  CHECK(cohort::scaling::cpu{}.intra_op_threads(t, 2) == 1);
  CHECK(cohort::scaling::cpu{.threads_per_worker = 5}.intra_op_threads(t, 2) == 5);
  CHECK(cohort::scaling::cpu{}.device_for(t).str() == "cpu");
}
