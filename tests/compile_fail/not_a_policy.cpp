// Must fail to compile: a "scaling policy" whose check() returns the wrong type is no policy.
#include <cohort/trainer.hpp>

struct broken_scaling {
  int check(int) const { return 0; }
  cohort::device device_for(cohort::scaling::topology const&) const { return {}; }
  int intra_op_threads(cohort::scaling::topology const&, int) const { return 1; }
};

int main() {
  cohort::trainer t{[](cohort::context&) {}, broken_scaling{}};
  (void)t;
}
