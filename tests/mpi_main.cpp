// The main of every test executable: MPI up, Catch2's session on every rank, and a failure on
// any rank fails the run on every rank. Ranks other than 0 report only failures. A test spec that
// matches no test fails the run (fail_on_unmatched_test_spec).
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

#include <cohort/environment.hpp>

#include <mpi.h>

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};  // as a user's main does: MPI, the ranks' cores
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) {
    fail_on_unmatched_test_spec(session);
    if (rank != 0) session.configData().showSuccessfulTests = false;
    rc = session.run();
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != rc) std::fprintf(stderr, "a test failed on another rank\n");
  return worst == 0 ? 0 : 1;
}
