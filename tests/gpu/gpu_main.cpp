// The main of the GPU tests: MPI up, then Catch2 only when every rank of this host has a CUDA
// device of its own (NCCL refuses two ranks on one device). Otherwise every rank says so and exits
// 77, which CTest counts as skipped (never as passed): gpu.1ranks needs one GPU, gpu.2ranks two.
#define CATCH_CONFIG_RUNNER
#include "../catch.hpp"

#include <cohort/scaling/cuda.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int ranks_here = 1, rank_here = 0;
  MPI_Comm_size(host, &ranks_here);
  MPI_Comm_rank(host, &rank_here);
  MPI_Comm_free(&host);
  if (int const devices = cohort::scaling::visible_cuda_devices(); devices < ranks_here) {
    std::printf("rank %d: %d CUDA device(s) visible for %d rank(s) on this host, one per rank needed: GPU tests skipped\n",
                rank, devices, ranks_here);
    MPI_Finalize();
    return 77;
  }
  cudaSetDevice(rank_here);  // each rank's current device is its own (what torch::kCUDA means)
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) {
    fail_on_unmatched_test_spec(session);  // a filter matching nothing fails, never passes
    rc = session.run();
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
