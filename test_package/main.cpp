// A trainer at the ranks it is started with: each rank checks its context and all-reduces rank+1.
// Exits 1 when any rank saw a wrong world size or sum; rank 0 prints one line the test looks for.
//   test_package <run dir parent> <expected ranks>
#include <cohort/trainer.hpp>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_package <run dir parent> <expected ranks>\n");
    return 2;
  }
  int const ranks = std::atoi(argv[2]);
  int const want_sum = ranks * (ranks + 1) / 2;
  cohort::environment env{argc, argv};
  auto r = cohort::trainer{[&](cohort::context& ctx) {
    int sum = ctx.world_rank() + 1;
    ctx.comm().allreduce(&sum, 1, cohort::comm::reduce_op::sum);
    bool const ok = ctx.world_size() == ranks && ctx.world_rank() >= 0 && ctx.world_rank() < ranks && sum == want_sum;
    ctx.report({{"sum", sum}, {"ok", ok}});
    return ok ? sum : -1;
  }}.fit(nlohmann::json::object(), {.name = "test_package", .storage_path = argv[1], .verbose = 0});
  bool ok = r.ok() && static_cast<int>(r.return_values.size()) == ranks;
  for (int v : r.return_values) ok = ok && v == want_sum;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    if (ok)
      std::printf("cohort test_package: %d ranks, all-reduce %d\n", ranks, want_sum);
    else
      std::printf("cohort test_package: FAILED (%s)\n", r.ok() ? "wrong world size or sum" : r.error->c_str());
  }
  return ok ? 0 : 1;
}
