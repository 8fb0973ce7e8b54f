// A tuning run of a class trainable for the restore test: each trial steps `value += lr` six
// times, checkpointing every step. With --kill-once (--term-once), the trial with lr = 0.4 sends
// SIGKILL (SIGTERM) to its own rank before its 4th step (once: a marker file remembers); after
// SIGTERM every running trial stops at its next report and the program exits with code 75. Rerun with the same name, the experiment
// must finish every trial exactly once: trials that finished are not rerun, interrupted ones go on
// from their checkpoints (so every result.json holds iterations 1..6 once). Prints "tune restore
// ok" when that holds. Each checkpoint a trial loads is appended to loaded_checkpoints.txt in the
// checkpoint's trial folder (the trial's lr and the checkpoint's name), which tune_restore.sh
// checks against the latest checkpoint each trial had committed when the first run stopped.
// With --sweep (tune_kill_anywhere.sh): twelve trials whose steps take 100 ms, each rank's pid in
// pids/rank_<r> (rewritten at every launch), to be killed from outside at any moment; prints
// "tune sweep ok" when every trial finished with value 6 lr.
#include <cohort/tuning/tuner.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

namespace {

std::filesystem::path marker;
int hurt = SIGKILL;
int step_ms = 0;

struct accumulate {
  double lr = 0;
  int steps = 0;
  double value = 0;

  void setup(nlohmann::json const& config) { lr = config.at("lr").get<double>(); }
  nlohmann::json step() {
    if (!marker.empty() && lr == 0.4 && steps == 3 && !std::filesystem::exists(marker)) {
      std::ofstream(marker) << "hurt\n";
      std::raise(hurt);
    }
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    ++steps;
    value += lr;
    return {{"value", value}, {"steps", steps}, {"done", steps >= 6}};
  }
  void save_checkpoint(std::filesystem::path const& dir) const {
    std::ofstream(dir / "state.json") << nlohmann::json{{"steps", steps}, {"value", value}}.dump();
  }
  void load_checkpoint(std::filesystem::path const& dir) {
    // What was loaded, for tune_restore.sh: this trial's lr and the checkpoint, in the folder of
    // the trial the checkpoint belongs to.
    std::ofstream(dir.parent_path() / "loaded_checkpoints.txt", std::ios::app)
        << nlohmann::json(lr).dump() << " " << dir.filename().string() << "\n";
    auto j = nlohmann::json::parse(std::ifstream(dir / "state.json"));
    steps = j.at("steps").get<int>();
    value = j.at("value").get<double>();
  }
};
static_assert(cohort::trainable_class<accumulate>);

}  // namespace

/// --sweep: twelve trials of 100 ms steps; every rank's pid in pids/rank_<r> for the killer.
int sweep(std::string const& storage) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::filesystem::create_directories(std::filesystem::path(storage) / "pids");
  std::ofstream(std::filesystem::path(storage) / "pids" / ("rank_" + std::to_string(rank))) << ::getpid() << "\n";
  step_ms = 100;
  std::vector<nlohmann::json> lrs;
  for (int i = 1; i <= 12; ++i) lrs.push_back(i / 10.0);
  cohort::tuner tuner{accumulate{}, cohort::tune_config{.metric = "value", .state_interval_s = 0, .checkpoint_frequency = 1}};
  auto grid = tuner.fit(cohort::space{{"lr", cohort::grid_search(lrs)}}, {.name = "sweep", .storage_path = storage, .verbose = 0});
  if (!grid.ok()) return 1;
  bool ok = grid.size() == 12;
  for (auto const& t : grid.trials)
    ok = ok && t.status == "TERMINATED" && std::abs(t.metrics.at("value").get<double>() - 6 * t.config.at("lr").get<double>()) < 1e-9;
  if (rank == 0) std::cout << (ok ? "tune sweep ok" : "tune sweep FAILED") << std::endl;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string storage = argc > 1 ? argv[1] : "runs";
  if (argc > 2 && std::string(argv[2]) == "--sweep") return sweep(storage);
  if (argc > 2) {
    marker = std::filesystem::path(storage) / "hurt.marker";
    hurt = std::string(argv[2]) == "--term-once" ? SIGTERM : SIGKILL;
  }
  cohort::tuner tuner{accumulate{}, cohort::tune_config{.metric = "value", .state_interval_s = 0, .checkpoint_frequency = 1}};
  auto grid = tuner.fit(cohort::space{{"lr", cohort::grid_search({0.1, 0.2, 0.3, 0.4, 0.5, 0.6})}},
                        {.name = "restore", .storage_path = storage, .verbose = 0});
  if (grid.preempted) return cohort::exit_code_preempted;
  if (!grid.ok()) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool ok = grid.size() == 6;
  for (auto const& t : grid.trials) {
    std::ifstream in(t.path / "result.json");
    int expect = 1;
    for (std::string line; std::getline(in, line); ++expect)
      ok = ok && nlohmann::json::parse(line).at("training_iteration").get<int>() == expect;
    double const lr = t.config.at("lr").get<double>();
    ok = ok && expect == 7 && t.status == "TERMINATED" && std::abs(t.metrics.at("value").get<double>() - 6 * lr) < 1e-12;
    if (!ok && rank == 0) std::cerr << t.id << " " << t.status << " " << t.metrics.dump() << " rows " << expect - 1 << "\n";
  }
  if (rank == 0) std::cout << (ok ? "tune restore ok" : "tune restore FAILED") << std::endl;
  return ok ? 0 : 1;
}
