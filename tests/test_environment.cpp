// cohort::environment's process settings: glibc's heap (heap_settings), set before MPI starts.
#include "catch.hpp"

#include <sys/resource.h>

#include <cohort/environment.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

TEST_CASE("cohort sets glibc's heap unless the job set any of it itself", "[environment][pure]") {
  using cohort::detail::job_sets_heap;
  CHECK_FALSE(job_sets_heap(nullptr, false));
  CHECK_FALSE(job_sets_heap("", false));
  CHECK_FALSE(job_sets_heap("glibc.pthread.rseq=0", false));  // another tunable
  CHECK(job_sets_heap("glibc.malloc.trim_threshold=1", false));
  CHECK(job_sets_heap("glibc.pthread.rseq=0:glibc.malloc.arena_max=2", false));
  CHECK(job_sets_heap(nullptr, true));  // a MALLOC_..._ variable
  cohort::detail::heap_settings const s;
  CHECK(s.mmap_threshold_bytes == 32 << 20);  // the most glibc takes
  CHECK(s.trim_threshold_bytes == 2 * s.mmap_threshold_bytes);
}

namespace {

long page_faults_of_this_thread() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

/// A step's worth of blocks: taken, written, given back (as a step's activations are).
void one_step(std::size_t blocks, std::size_t bytes) {
  std::vector<void*> taken;
  for (std::size_t i = 0; i < blocks; ++i) {
    void* p = std::malloc(bytes);
    REQUIRE(p != nullptr);
    std::memset(p, 1, bytes);
    asm volatile("" : : "r"(p) : "memory");  // written for real, not elided with the free
    taken.push_back(p);
  }
  for (void* p : taken) std::free(p);
}

}  // namespace

TEST_CASE("a step's freed blocks stay in the heap for the next step, without page faults", "[environment]") {
  // Catches: cohort::environment (the tests' main) not setting heap_settings, where glibc's
  // default gives 40 MiB freed at the heap's top back to the system, to fault in again next step.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("a sanitizer's allocator replaces glibc's heap here: nothing to check");
  return;
#endif
  if (cohort::detail::job_sets_heap()) {
    WARN("the job sets glibc's heap itself, so cohort left it alone: nothing to check");
    return;
  }
  std::size_t const blocks = 5, bytes = 8 << 20;  // 40 MiB: each block under the mmap threshold, all under the trim threshold
  one_step(blocks, bytes);                         // the first step takes its pages from the system
  auto const before = page_faults_of_this_thread();
  one_step(blocks, bytes);
  auto const faults = page_faults_of_this_thread() - before;
  INFO(faults << " page faults in the second step; " << blocks * bytes / 4096 << " if its memory went back");
  CHECK(faults < static_cast<long>(blocks * bytes / 4096 / 20));
}
