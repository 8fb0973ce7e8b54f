// cohort::environment for mpi_main.cpp, in a translation unit of its own: the sanitizer trees
// instrument cohort's code, and compile the main's Catch2 uninstrumented (tests/CMakeLists.txt).
#include <cohort/environment.hpp>

#include <memory>

/// MPI up and the ranks' cores found, as a user's main does; down when the result is destroyed.
std::shared_ptr<void> start_test_environment(int& argc, char**& argv) {
  return std::make_shared<cohort::environment>(argc, argv);
}
