// A rank whose functor throws while the others wait in a collective it will never enter: the job
// must end (MPI_Abort after run_config.abort_timeout_ms) with the error printed, not hang.
#include <cohort/trainer.hpp>

#include <stdexcept>

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  auto r = cohort::trainer{[](cohort::context& ctx) {
             if (ctx.world_rank() == ctx.world_size() - 1) throw std::runtime_error("boom before the barrier");
             ctx.comm().barrier();  // the last rank never arrives
           }}.fit(nlohmann::json::object(), {.name = "stuck", .storage_path = "/tmp/cohort_tests/stuck", .verbose = 0,
                                             .abort_timeout_ms = 2000});
  return r.ok() ? 0 : 1;
}
