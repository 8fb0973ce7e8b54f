#pragma once
// Helpers shared by the tests.

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>

#include <cohort/run_config.hpp>

namespace cohort_test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// A fresh directory shared by all ranks: rank 0's pid and the world size name it.
inline std::filesystem::path scratch(std::string const& what) {
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  auto p = std::filesystem::temp_directory_path() / "cohort_tests" /
           (what + "_" + std::to_string(pid) + "_" + std::to_string(world_size()));
  if (world_rank() == 0) std::filesystem::remove_all(p);
  MPI_Barrier(MPI_COMM_WORLD);
  return p;
}

/// A run in a fresh scratch directory (`what`) that prints nothing, with a 30 s abort deadline.
inline cohort::run_config quiet(std::string const& what) {
  return {.name = "run", .storage_path = scratch(what).string(), .verbose = 0, .abort_timeout_ms = 30'000};
}

/// A file's contents, byte for byte.
inline std::string slurp(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Captures what is written to std::cerr while it lives (the stream's buffer swapped).
class capture_stderr {
 public:
  capture_stderr() : old_(std::cerr.rdbuf(buf_.rdbuf())) {}
  capture_stderr(capture_stderr const&) = delete;
  capture_stderr& operator=(capture_stderr const&) = delete;
  ~capture_stderr() { std::cerr.rdbuf(old_); }
  std::string text() const { return buf_.str(); }

 private:
  std::ostringstream buf_;
  std::streambuf* old_;
};

}  // namespace cohort_test
