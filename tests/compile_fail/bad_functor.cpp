// Must fail to compile: the functor does not take a cohort::context.
#include <cohort/trainer.hpp>

int main() {
  cohort::trainer t{[](int) {}};
  auto r = t.fit(nlohmann::json::object());
  (void)r;
}
