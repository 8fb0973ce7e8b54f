#include <cohort/comm/nccl.hpp>

#include <cstdio>

// Built against cohort::nccl: the NCCL communicator compiles and links; no GPU is needed to run.
int main() {
  static_assert(cohort::comm::communicator<cohort::comm::nccl>);
  std::printf("consumer_nccl built with NCCL %d\n", NCCL_VERSION_CODE);
  return 0;
}
