#include <cohort/concepts.hpp>
#include <cohort/detail/background_worker.hpp>
#include <cohort/scaling/cpu_set.hpp>
#include <cohort/scaling/cpu.hpp>
#include <cohort/scaling/cuda.hpp>
#include <cohort/scaling/topology.hpp>

#include <mpi.h>
#include <pthread.h>

#include <algorithm>
#include <string>

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

TEST_CASE("scaling::cpu with a worker range accepts any rank count in it (elastic relaunch)", "[scaling][pure]") {
  cohort::scaling::cpu const elastic{.min_workers = 2, .max_workers = 4};
  for (int n : {2, 3, 4}) CHECK_FALSE(elastic.check(n).has_value());
  auto few = elastic.check(1);
  REQUIRE(few.has_value());
  CHECK_THAT(*few, contains_text("scaling::cpu{.min_workers = 2} but the job has 1 rank: too few hosts are left"));
  auto many = elastic.check(5);
  REQUIRE(many.has_value());
  CHECK_THAT(*many, contains_text("scaling::cpu{.max_workers = 4} but the job has 5 ranks: launch with mpirun -np 4 or fewer"));
  CHECK_FALSE(cohort::scaling::cpu{.min_workers = 3}.check(17).has_value());  // no maximum
  auto both = cohort::scaling::cpu{.num_workers = 2, .min_workers = 1}.check(2);
  REQUIRE(both.has_value());
  CHECK_THAT(*both, contains_text("either an exact count or a range"));
  auto upside_down = cohort::scaling::cpu{.min_workers = 3, .max_workers = 2}.check(2);
  REQUIRE(upside_down.has_value());
  CHECK_THAT(*upside_down, contains_text("the minimum is above the maximum"));
  CHECK(cohort::scaling::cpu{.max_workers = -1}.check(2).has_value());
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

TEST_CASE("scaling::cuda gives trials side by side on one node disjoint GPUs, or says there are too few", "[scaling][pure]") {
  // Catches: every trial group's rank 0 on GPU 0 (the device taken from the rank in the trial's
  // communicator), and a placement check that counts one trial's ranks instead of the node's.
  // Two trials of 2 ranks on one node of 4 ranks: the second trial's ranks are the job's 2 and 3.
  cohort::scaling::cuda policy{};
  auto second_trial = cohort::scaling::topology_from_hosts({"a", "a"}, 1);
  CHECK(policy.device_for(second_trial).str() == "cuda:1");  // alone (no job-wide place known)
  second_trial.job_local_rank = 3;
  second_trial.job_local_size = 4;
  CHECK(policy.device_for(second_trial).str() == "cuda:3");
  CHECK_FALSE(policy.placement_error(second_trial, 4));
  auto e = policy.placement_error(second_trial, 2);  // enough for one trial, not for both
  REQUIRE(e);
  CHECK_THAT(*e, contains_text("scaling::cuda: node 0 runs 4 ranks (trials side by side, each with GPUs of its own) but sees 2 GPUs"));
}

TEST_CASE("CPU lists parse like Linux writes them", "[scaling][pure]") {
  using cohort::scaling::cpu_list;
  using cohort::scaling::parse_cpu_list;
  CHECK(parse_cpu_list("0-3,8,10-11\n") == cpu_list{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == cpu_list{5});
  CHECK(parse_cpu_list("2,0-1,1") == cpu_list{0, 1, 2});
  CHECK(parse_cpu_list("").empty());
  CHECK(parse_cpu_list("3-1").empty());
  CHECK(parse_cpu_list("0-x").empty());
  CHECK(parse_cpu_list("a,1").empty());
}

TEST_CASE("the job's cores are what its launcher may use, within the node", "[scaling][pure]") {
  using cohort::scaling::cpu_list;
  using cohort::scaling::allowed_cpus_in_status;
  std::string const status =
      "Name:\torted\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1,6\nMems_allowed_list:\t0\n";
  CHECK(allowed_cpus_in_status(status) == cpu_list{0, 1, 6});
  CHECK(allowed_cpus_in_status("Cpus_allowed_list:\t5").size() == 1);
  CHECK(allowed_cpus_in_status("Name:\tsh\n").empty());
  CHECK(allowed_cpus_in_status("Cpus_allowed_list:\tx\n").empty());
  // taskset -c 2-3 mpirun ... on an 8-core node: the job has cores 2 and 3, and nothing spare
  // outside them.
  cpu_list const node{0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(cohort::scaling::common_cpus(node, {2, 3}) == cpu_list{2, 3});
  CHECK(cohort::scaling::common_cpus(node, {9}).empty());
  CHECK(cohort::scaling::common_cpus({}, node).empty());
}

TEST_CASE("spare cores are the node's cores no local rank is bound to", "[scaling][pure]") {
  using cohort::scaling::cpu_list;
  cpu_list const node{0, 1, 2, 3, 4, 5, 6, 7};
  // mpirun -np 2: one core each; six spare, each rank alone on its core.
  CHECK(cohort::scaling::spare_cpus(node, {{0}, {1}}) == cpu_list{2, 3, 4, 5, 6, 7});
  CHECK(cohort::scaling::ranks_sharing({0}, {{0}, {1}}) == 1);
  // Not bound: nothing spare, every rank shares every core.
  CHECK(cohort::scaling::spare_cpus(node, {node, node, node}).empty());
  CHECK(cohort::scaling::ranks_sharing(node, {node, node, node}) == 3);
  // Bound to sockets of four cores, two ranks per socket: nothing spare, two ranks per socket.
  std::vector<cpu_list> const sockets{{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {4, 5, 6, 7}};
  CHECK(cohort::scaling::spare_cpus(node, sockets).empty());
  CHECK(cohort::scaling::ranks_sharing({4, 5, 6, 7}, sockets) == 2);
  // Every core bound (two ranks on two cores): nothing spare.
  CHECK(cohort::scaling::spare_cpus({0, 1}, {{0}, {1}}).empty());
  // A bitmap carries a list through one allgather.
  cpu_list const odd{1, 63, 64, 1023};
  CHECK(cohort::scaling::from_bitmap(cohort::scaling::to_bitmap(odd)) == odd);
}

TEST_CASE("a rank whose binding costs it training threads is told to launch unbound", "[scaling][pure]") {
  using cohort::scaling::binding_warning;
  using cohort::scaling::cpu_list;
  cpu_list const two{0, 1}, eight{0, 1, 2, 3, 4, 5, 6, 7};
  // mpirun -np 1 on two cores: bound to one, one thread, where unbound it would have two.
  auto const w = binding_warning(0, {0}, two, 1, 1, 1);
  CHECK_THAT(w, contains_text("rank 0 is bound to 1 of this node's 2 cores"));
  CHECK_THAT(w, contains_text("trains on 1 core where unbound it would have 2"));
  CHECK_THAT(w, contains_text("mpirun --bind-to none"));
  // mpirun -np 2 on two cores, a core each: that is each rank's share anyway.
  CHECK(binding_warning(1, {1}, two, 1, 2, 1).empty());
  // Not bound, or bound to the whole node: nothing to say.
  CHECK(binding_warning(0, two, two, 1, 1, 2).empty());
  CHECK(binding_warning(0, {}, two, 1, 1, 2).empty());
  // Four ranks bound to sockets of four cores, two per socket: two cores each, as unbound.
  CHECK(binding_warning(2, {4, 5, 6, 7}, eight, 2, 4, 2).empty());
  // mpirun -np 2 on eight cores: a core each, where unbound each would have four.
  CHECK_THAT(binding_warning(1, {1}, eight, 1, 2, 1), contains_text("where unbound it would have 4"));
  // More threads than bound cores (threads_per_worker set): they take turns.
  CHECK_THAT(binding_warning(0, {0, 1}, eight, 1, 4, 4), contains_text("fewer than its 4 intra-op threads"));
}

TEST_CASE("background threads run on the node's spare cores, else on the rank's own", "[scaling][mpi]") {
  auto const& p = cohort::scaling::placement();
  REQUIRE(p.known);  // cohort::environment (tests/mpi_main.cpp) found it
  CHECK(p.mine == cohort::scaling::this_thread_cpus());
  int local = 0;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  CHECK(p.ranks.size() == static_cast<std::size_t>(local));
  for (int c : p.spare)
    for (auto const& r : p.ranks) CHECK_FALSE(std::binary_search(r.begin(), r.end(), c));
  if (p.mine.size() < p.node.size() && local == 1) CHECK_FALSE(p.spare.empty());  // one bound rank
  cohort::scaling::cpu_list seen;
  char name[16] = {};
  {
    cohort::detail::background_worker worker{"cohort-test"};
    worker.start([&] {
      seen = cohort::scaling::this_thread_cpus();
#ifdef __linux__
      pthread_getname_np(pthread_self(), name, sizeof name);
#endif
    });
    worker.wait();
  }
  CHECK(seen == (p.spare.empty() ? p.mine : p.spare));
#ifdef __linux__
  CHECK(std::string(name) == "cohort-test");  // top -H and perf tell it from the training thread
#endif
  CHECK(cohort::scaling::this_thread_cpus() == p.mine);  // the caller stays where mpirun put it
}
