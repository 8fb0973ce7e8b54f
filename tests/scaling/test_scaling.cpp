#include <cohort/concepts.hpp>
#include <cohort/scaling/cpu.hpp>
#include <cohort/scaling/cuda.hpp>
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

TEST_CASE("scaling::cuda puts local rank r on visible GPU r and refuses more ranks than GPUs", "[scaling][pure]") {
  STATIC_REQUIRE(cohort::scaling_policy<cohort::scaling::cuda>);
  cohort::scaling::cuda policy{.num_workers = 4};
  auto t = cohort::scaling::topology_from_hosts({"a", "a", "b", "b"}, 3);
  CHECK(policy.device_for(t).str() == "cuda:1");
  CHECK_FALSE(policy.placement_error(t, 2));
  CHECK_FALSE(policy.placement_error(t, 8));
  auto e = policy.placement_error(t, 1);
  REQUIRE(e);
  CHECK_THAT(*e, contains_text("scaling::cuda: node 1 runs 2 ranks but sees 1 GPU: start at most one rank per GPU"));
  CHECK_THAT(*policy.placement_error(t, 0), contains_text("none visible, or cohort built without cohort::nccl"));
  CHECK_THAT(*policy.check(3), contains_text("scaling::cuda{.num_workers = 4} but the job has 3 ranks"));
  CHECK_FALSE(policy.check(4));
}
