// Must fail to compile: two policies for the same axis.
#include <cohort/trainer.hpp>

int main() {
  cohort::trainer t{[](cohort::context&) {}, cohort::scaling::cpu{}, cohort::scaling::cpu{.num_workers = 2}};
  (void)t;
}
