// libFuzzer target: the tuner's restore of an experiment on an arbitrary experiment_state.json:
// tuning::detail::parse_experiment_state, then restore_policies into each shipped searcher and
// scheduler (set up over a fixed space, as a resumed experiment would be), and parse_result_rows
// on the same bytes as a trial's result.json. Each must return or throw cohort::error; an
// accepted state's trial ids must be unique trial_NNNNN names below next_trial.
#include <cohort/tuning/experiment_state.hpp>
#include <cohort/tuning/schedulers.hpp>
#include <cohort/tuning/searchers.hpp>

#include <cstdint>
#include <set>
#include <string_view>

namespace {

cohort::tuning::space const& fuzz_space() {
  static cohort::tuning::space const sp{{"lr", cohort::loguniform(1e-4, 1e-1)},
                                        {"batch_size", cohort::choice({16, 32, 64})},
                                        {"layers", cohort::randint(1, 4)},
                                        {"epochs", 3}};
  return sp;
}

template <class Searcher, class Scheduler>
void restore(cohort::tuning::detail::experiment_state const& state, Searcher searcher, Scheduler scheduler) {
  cohort::tuning::objective const obj{"loss", cohort::order::min};
  searcher.setup(fuzz_space(), obj, 4);
  scheduler.setup(obj);
  try {
    cohort::tuning::detail::restore_policies(state, searcher, scheduler, "experiment_state.json");
  } catch (cohort::error const&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const text(reinterpret_cast<char const*>(data), size);
  for (auto const& row : cohort::tuning::detail::parse_result_rows(text))
    if (!row.is_object()) __builtin_trap();
  try {
    auto const state = cohort::tuning::detail::parse_experiment_state(text, "experiment_state.json");
    std::set<std::string> ids;
    for (auto const& t : state.trials) {
      auto const n = cohort::tuning::detail::trial_number(t.id);
      if (!n || *n >= state.next_trial || !ids.insert(t.id).second || t.id.find('/') != std::string::npos) __builtin_trap();
    }
    using cohort::schedule::mutation;
    restore(state, cohort::search::basic{}, cohort::schedule::fifo{});
    restore(state, cohort::search::tpe{.n_startup_trials = 1}, cohort::schedule::asha{.max_t = 16, .brackets = 2});
    restore(state, cohort::search::basic{}, cohort::schedule::median_stopping{});
    restore(state, cohort::search::basic{},
            cohort::schedule::pbt{.hyperparam_mutations = {{"lr", mutation::range{.low = 1e-4, .high = 1e-1, .log = true}},
                                                           {"batch_size", mutation::values({16, 32, 64})}}});
  } catch (cohort::error const&) {
  }
  return 0;
}
