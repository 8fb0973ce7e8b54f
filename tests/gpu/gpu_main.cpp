// The main of the GPU tests: MPI up, then Catch2 only when a CUDA device is visible. Without one,
// every rank says so and exits 77, which CTest counts as skipped (never as passed).
#define CATCH_CONFIG_RUNNER
#include "../catch.hpp"

#include <cohort/scaling/cuda.hpp>

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (cohort::scaling::visible_cuda_devices() == 0) {
    std::printf("rank %d: no CUDA device visible: GPU tests skipped\n", rank);
    MPI_Finalize();
    return 77;
  }
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
