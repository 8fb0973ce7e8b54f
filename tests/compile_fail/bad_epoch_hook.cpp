// Must fail to compile: an epoch-end hook that does not take (cohort::context&, nlohmann::json&);
// the error names the concept, cohort::epoch_end_hook.
#include <cohort/torch/fit_loop.hpp>

int main() {
  auto hook = cohort::on_epoch_end([](int epoch) { return epoch > 3; });
  (void)hook;
}
