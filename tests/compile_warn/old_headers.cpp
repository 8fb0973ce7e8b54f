// A program written against the old header names: it still compiles, each header warning that it
// is deprecated and naming its replacement (tests/CMakeLists.txt: compile_warn.old_headers).
#include <cohort/torch/checkpoint.hpp>
#include <cohort/torch/device.hpp>
#include <cohort/reporter.hpp>

int main() {
  auto const d = cohort::to_torch(cohort::device{});                    // from to_torch.hpp
  auto payload = cohort::checkpoint_of(nlohmann::json{{"epoch", 1}});  // from checkpoint_state.hpp
  (void)payload;
  cohort::report::protocol_options const options{};                   // from report/protocol.hpp
  (void)options;
  return d.is_cpu() ? 0 : 1;
}
