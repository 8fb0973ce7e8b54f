// Logs to a real MLflow tracking server (tests/report/mlflow_check.sh starts one):
//   mpirun -np 2 cohort_mlflow_program --uri URI --mode run|sweep --name NAME --storage DIR
//          [--steps N] [--sleep-ms M]
// run: one trainer run of N reports (a checkpoint every 5th) with cohort::report::mlflow;
// sweep: a tuner of 4 trials (one rank each) of N reports, nested under the experiment's run.
// Rank 0 prints one JSON line: the seconds from the start to the end of training and of fit().
#include <cohort/report/mlflow.hpp>
#include <cohort/trainer.hpp>
#include <cohort/tuning/tuner.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

struct settings {
  std::string uri, mode = "run", name = "mlflow_run", storage = "/tmp/cohort_mlflow";
  int steps = 10;
  int sleep_ms = 10;
};

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const flag = argv[i], value = argv[i + 1];
    if (flag == "--uri") s.uri = value;
    else if (flag == "--mode") s.mode = value;
    else if (flag == "--name") s.name = value;
    else if (flag == "--storage") s.storage = value;
    else if (flag == "--steps") s.steps = std::stoi(value);
    else if (flag == "--sleep-ms") s.sleep_ms = std::stoi(value);
    else {
      std::cerr << "unknown flag " << flag << ": use --uri, --mode run|sweep, --name, --storage, --steps, --sleep-ms\n";
      return 2;
    }
  }
  auto const start = std::chrono::steady_clock::now();
  auto trained_s = std::make_shared<double>(0);
  auto fn = [&s, start, trained_s](cohort::context& ctx, nlohmann::json const& config) {
    double const lr = config.at("lr").get<double>();
    for (int i = 1; i <= s.steps; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(s.sleep_ms));
      // The loss falls until the middle step and rises after it: the best checkpoint is the last
      // one at or before the middle, not the newest.
      int const middle = s.steps / 2;
      double const loss = i <= middle ? 1.0 / (i * lr * 10) : 1.0 / (middle * lr * 10) + (i - middle) * 0.1;
      nlohmann::json metrics{{"loss", loss}, {"val", {{"acc", i / (s.steps + 1.0)}}}, {"epoch", i}};
      if (i % 5 == 0)
        ctx.report(metrics, cohort::checkpoint_payload{[i](std::filesystem::path const& dir, int rank) {
                     if (rank == 0) std::ofstream(dir / "step") << i;
                   }});
      else
        ctx.report(metrics);
    }
    *trained_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // A trainer's run names the metric of its best checkpoint; a sweep takes the tuner's.
  cohort::report::mlflow tracker{.tracking_uri = s.uri, .experiment_name = "cohort-tests"};
  if (s.mode == "run") tracker.metric = "loss";
  cohort::run_config const run{.name = s.name, .storage_path = s.storage, .verbose = 0};
  bool ok = false;
  if (s.mode == "run") {
    cohort::trainer trainer{fn, tracker};
    ok = trainer.fit(nlohmann::json{{"lr", 0.1}, {"model", {{"width", 64}, {"kind", "mlp"}}}}, run).ok();
  } else {
    cohort::tuner tuner{fn, tracker, cohort::tune_config{.metric = "loss", .mode = cohort::min, .ranks_per_trial = 1, .status_interval_s = 1e9}};
    ok = tuner.fit(cohort::space{{"lr", cohort::grid_search({0.1, 0.2, 0.3, 0.4})}}, run).ok();
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("{\"trained_s\": %.3f, \"fit_s\": %.3f}\n", *trained_s,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ok ? 0 : 1;
}
