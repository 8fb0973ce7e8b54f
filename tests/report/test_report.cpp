#include <cohort/report/console.hpp>
#include <cohort/report/flatten.hpp>
#include <cohort/report/html_report.hpp>
#include <cohort/report/recorder.hpp>
#include <cohort/report/run_directory.hpp>
#include <cohort/report/trial_table.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <thread>

#include "../catch.hpp"
#include "../support.hpp"

namespace {
using cohort_test::slurp;
}  // namespace

TEST_CASE("nested metrics flatten into a/b columns", "[report][pure]") {
  nlohmann::json j = {{"loss", 1.5}, {"val", {{"acc", 0.9}, {"f1", {{"macro", 0.5}}}}}, {"tags", {1, 2}}};
  auto flat = cohort::report::flatten(j);
  REQUIRE(flat.size() == 4);
  CHECK(flat[0].first == "loss");
  CHECK(flat[1].first == "tags");
  CHECK(flat[2].first == "val/acc");
  CHECK(flat[3].first == "val/f1/macro");
  CHECK(cohort::report::csv_field("a,b") == "\"a,b\"");
  CHECK(cohort::report::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
}

TEST_CASE("the run directory holds params.json, result.json lines and a widening progress.csv, and appends on a rerun", "[report][pure]") {
  auto root = cohort_test::scratch("rundir") / std::to_string(cohort_test::world_rank());
  cohort::report::run_directory dir(root / "run", {{"lr", 0.1}});
  for (auto const* file : {"result.json", "progress.csv"}) {  // created empty with the directory, as Ray does
    CHECK(std::filesystem::exists(root / "run" / file));
    CHECK(slurp(root / "run" / file).empty());
  }
  dir.append({{"loss", 1.0}, {"training_iteration", 1}});
  dir.append({{"loss", 0.5}, {"training_iteration", 2}, {"val", {{"acc", 0.7}}}});
  CHECK(nlohmann::json::parse(slurp(root / "run" / "params.json"))["lr"] == 0.1);
  std::istringstream lines(slurp(root / "run" / "result.json"));
  std::string a, b;
  std::getline(lines, a);
  std::getline(lines, b);
  CHECK(nlohmann::json::parse(a)["loss"] == 1.0);
  CHECK(nlohmann::json::parse(b)["val"]["acc"] == 0.7);
  CHECK(slurp(root / "run" / "progress.csv") == "loss,training_iteration,val/acc\n1.0,1,\n0.5,2,0.7\n");
  CHECK_FALSE(std::filesystem::exists(root / "run" / "params.json.tmp"));
  // a rerun of the same run appends: earlier rows are never rewritten or dropped
  cohort::report::run_directory again(root / "run", {{"lr", 9.9}});
  REQUIRE(again.previous_rows().size() == 2);
  CHECK(again.previous_rows()[1]["loss"] == 0.5);
  again.append({{"loss", 0.25}, {"training_iteration", 3}});
  CHECK(slurp(root / "run" / "result.json").substr(0, a.size() + b.size() + 2) == a + "\n" + b + "\n");
  CHECK(slurp(root / "run" / "progress.csv") == "loss,training_iteration,val/acc\n1.0,1,\n0.5,2,0.7\n0.25,3,\n");
  CHECK(nlohmann::json::parse(slurp(root / "run" / "params.json"))["lr"] == 0.1);  // the run's original params
}

TEST_CASE("a params.json cut short by a crash is written again by the rerun", "[report][pure]") {
  auto root = cohort_test::scratch("rundir_params") / std::to_string(cohort_test::world_rank());
  std::filesystem::create_directories(root / "run");
  std::ofstream(root / "run" / "params.json") << "{\"lr\": 0.";  // the crash
  cohort::report::run_directory dir(root / "run", {{"lr", 0.1}});
  CHECK_FALSE(dir.fresh());
  CHECK(nlohmann::json::parse(slurp(root / "run" / "params.json"))["lr"] == 0.1);
  // nested storage paths are created whole
  cohort::report::run_directory deep(root / "a" / "b" / "run", {{"lr", 0.2}});
  CHECK(deep.fresh());
  CHECK(nlohmann::json::parse(slurp(root / "a" / "b" / "run" / "params.json"))["lr"] == 0.2);
}

TEST_CASE("a tuner's trials write their files beside training only when a trial is long enough to hide the hand-over", "[report][pure]") {
  using namespace std::chrono_literals;
  CHECK_FALSE(cohort::report::files_beside_training(0us));
  CHECK_FALSE(cohort::report::files_beside_training(9999us));
  CHECK(cohort::report::files_beside_training(10ms));
  CHECK(cohort::report::files_beside_training(2s));
}

TEST_CASE("a file_writer runs a short run's jobs on the caller's thread and a long one's on its own, keeping the first failure for settle()", "[report]") {
  using namespace std::chrono_literals;
  cohort::report::file_writer files;
  auto const caller = std::this_thread::get_id();
  std::vector<std::thread::id> ran;
  REQUIRE_FALSE(files.beside_training());  // nothing known yet: on the caller's thread
  files.start([&] { ran.push_back(std::this_thread::get_id()); });
  REQUIRE(ran.size() == 1);  // already run
  CHECK(ran[0] == caller);
  std::this_thread::sleep_for(12ms);  // a run of 12 ms: the next one's files beside it
  CHECK_FALSE(files.settle());
  REQUIRE(files.beside_training());
  files.start([&] { ran.push_back(std::this_thread::get_id()); });
  files.start([&] { files.fail("could not append to result.json: check free space"); });
  files.start([&] { files.fail("a later failure"); });
  auto const failure = files.settle();  // waits for all three
  REQUIRE(ran.size() == 2);
  CHECK(ran[1] != caller);
  REQUIRE(failure);
  CHECK(*failure == "could not append to result.json: check free space");  // the first one
  CHECK_FALSE(files.failure());  // taken
  files.begin_run();  // a run that starts no job (a resumed trial writing inline) is timed from its start
  std::this_thread::sleep_for(12ms);
  CHECK_FALSE(files.settle());
  CHECK(files.beside_training());
}

TEST_CASE("a file_writer's end_run tells a run's failure after its jobs without waiting, the next run keeping its own", "[report]") {
  // Catches: end_run waiting for the run's files (a tuner's next trial would wait for them), a
  // run's failure seen by the next run's reports (failing a trial for another's files), or lost.
  using namespace std::chrono_literals;
  cohort::report::file_writer files;
  files.start([] { std::this_thread::sleep_for(12ms); });
  REQUIRE_FALSE(files.settle());
  REQUIRE(files.beside_training());
  std::promise<void> go;
  auto gate = go.get_future().share();
  auto const first = files.run();
  files.start([&] { files.fail("could not append to result.json: check free space"); });
  files.start([gate] { gate.wait(); });  // the run's last files, held back
  while (!files.failure_of(first)) std::this_thread::yield();
  CHECK(files.failure() == "could not append to result.json: check free space");  // its own run's, at its next report
  std::this_thread::sleep_for(12ms);
  std::atomic<bool> ended{false};
  std::optional<std::string> told;
  files.end_run([&](std::optional<std::string> failure) {
    told = std::move(failure);
    ended = true;
  });
  CHECK_FALSE(ended.load());     // returned before the run's files were written
  CHECK(files.run() == first + 1);
  CHECK_FALSE(files.failure());  // the next run has none of its own
  files.start([&] { files.fail("a failure of the next run"); });
  go.set_value();
  auto const next = files.settle();
  CHECK(ended.load());
  CHECK(told == "could not append to result.json: check free space");
  CHECK(next == "a failure of the next run");
  CHECK_FALSE(files.failure());
}

TEST_CASE("a recorder with a file_writer writes the run directory's files on it, all there once settled, and throws its failure at the next report", "[report]") {
  using namespace std::chrono_literals;
  auto root = cohort_test::scratch("recorder_files") / std::to_string(cohort_test::world_rank());
  std::filesystem::remove_all(root);
  cohort::report::file_writer files;
  files.start([] { std::this_thread::sleep_for(12ms); });  // an earlier run long enough: beside training
  REQUIRE_FALSE(files.settle());
  REQUIRE(files.beside_training());
  cohort::detail::background_worker worker{"test-writer"};
  {
    cohort::report::recorder rows(worker);
    rows.open(root / "run", {{"lr", 0.1}}, "run", {.tensorboard = true, .files = &files});
    CHECK(std::filesystem::is_directory(root / "run"));  // made here: checkpoints may be committed into it
    CHECK(rows.fresh());
    rows.record(rows.row_of({{"loss", 1.0}}));
    rows.record(rows.row_of({{"loss", 0.5}}), nullptr, /*durable=*/true);  // a checkpoint's row: written when it returns
    CHECK(slurp(root / "run" / "result.json").find("\"loss\":0.5") != std::string::npos);
    files.start([] { std::this_thread::sleep_for(30ms); });  // the writer busy: the last row waits behind this
    rows.record(rows.row_of({{"loss", 0.25}}));  // handed over, or left for ~recorder to hand over
    CHECK(rows.history().size() == 3);
  }
  // a rerun of the run (a trial's retry), before the writer is settled: it reads back every row
  // after the writer's earlier jobs
  {
    cohort::report::recorder rows(worker);
    rows.open(root / "run", {{"lr", 0.1}}, "run", {.files = &files});
    CHECK_FALSE(rows.fresh());
    rows.resume_at(3);
    CHECK(rows.history().size() == 3);
    files.fail("could not append to result.json: check free space");  // as a job would
    CHECK_THROWS_WITH(rows.record(rows.row_of({{"loss", 0.1}})), "could not append to result.json: check free space");
  }
  CHECK(files.settle() == std::optional<std::string>("could not append to result.json: check free space"));
  CHECK(nlohmann::json::parse(slurp(root / "run" / "params.json"))["lr"] == 0.1);
  std::istringstream lines(slurp(root / "run" / "result.json"));
  std::vector<double> losses;
  for (std::string line; std::getline(lines, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  CHECK(losses == std::vector<double>{1.0, 0.5, 0.25});
  CHECK(slurp(root / "run" / "progress.csv").find("\n0.25,") != std::string::npos);
  std::size_t events = 0;
  for (auto const& e : std::filesystem::directory_iterator(root / "run"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) ++events;
  CHECK(events == 1);
}

TEST_CASE("the progress line shows the iteration, time and metrics", "[report][pure]") {
  auto line = cohort::report::progress_line(
      "run", {{"training_iteration", 3}, {"time_total_s", 12.34}, {"loss", 0.25}, {"timestamp", 1}});
  CHECK(line == "[cohort] run iter 3 (12.3 s): loss=0.25");
}

TEST_CASE("the console printer writes every line, in order, by drain() and by its destruction", "[report]") {
  auto const file = std::filesystem::temp_directory_path() / ("cohort_console_" + std::to_string(::getpid()) + ".txt");
  std::fflush(stdout);
  int const saved = ::dup(STDOUT_FILENO);
  int const fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, STDOUT_FILENO);
  std::string after_drain;
  cohort::detail::background_worker worker{"test-printer"};
  {
    cohort::report::console_printer console{worker};
    for (int i = 0; i < 200; ++i) console.print("line " + std::to_string(i));
    console.drain();
    after_drain = slurp(file);
    console.print("last");
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(fd);
  std::string expected;
  for (int i = 0; i < 200; ++i) expected += "line " + std::to_string(i) + "\n";
  CHECK(after_drain == expected);
  CHECK(slurp(file) == expected + "last\n");
  std::filesystem::remove(file);
}

TEST_CASE("the trial table shows each trial's status, parameters and metric; the CSV has one row per trial", "[report][pure]") {
  std::vector<cohort::report::trial_row> trials{
      {"trial_00000", "TERMINATED", {{"lr", 0.1}, {"opt", {{"m", 0.9}}}}, {{"acc", 0.5}, {"training_iteration", 3}, {"time_total_s", 1.5}}, "/x/trial_00000", "", 0},
      {"trial_00001", "RUNNING", {{"lr", 0.01}, {"opt", {{"m", 0.8}}}}, {{"acc", 0.25}, {"training_iteration", 1}, {"time_total_s", 0.5}}, "/x/trial_00001", "", 0},
      {"trial_00002", "ERROR", {{"lr", 1.0}, {"opt", {{"m", 0.0}}}}, nlohmann::json::object(), "/x/trial_00002", "boom, \"bad\"", 0}};
  auto table = cohort::report::trial_table(trials, 12.0, {.metric = "acc", .scheduler = "Using FIFO scheduling algorithm."});
  CHECK_THAT(table, contains_text("3 trials: 1 ERROR 1 RUNNING 1 TERMINATED\nUsing FIFO scheduling algorithm.\n"
                                  "Current best trial: trial_00000 with acc=0.5 and parameters={\"lr\":0.1,\"opt\":{\"m\":0.9}}\n+--"));
  CHECK_THAT(table, contains_text("| trial       | status     | lr   | opt/m | acc  | iter | total time (s) |"));
  CHECK(table.find("| trial_00001") < table.find("| trial_00000"));  // running trials first
  CHECK(cohort::report::trial_table(trials, 1.0, {.metric = "acc", .max_rows = 2}).find("1 more trials not shown") != std::string::npos);
  auto csv = cohort::report::trials_csv(trials);
  CHECK(csv.substr(0, csv.find('\n')) == "trial_id,status,acc,time_total_s,training_iteration,config/lr,config/opt/m,logdir,error");
  CHECK_THAT(csv, contains_text("trial_00002,ERROR,,,,1,0,/x/trial_00002,\"boom, \"\"bad\"\"\""));

  // A trial that failed and runs again (tune_config::max_failures): its failures in both.
  trials[1].failures = 2;
  table = cohort::report::trial_table(trials, 12.0, {.metric = "acc"});
  CHECK_THAT(table, contains_text("| trial       | status     | lr   | opt/m | acc  | iter | total time (s) | failures |"));
  CHECK_THAT(table, contains_text("| 0.5            | 2        |"));
  csv = cohort::report::trials_csv(trials);
  CHECK(csv.substr(0, csv.find('\n')) == "trial_id,status,acc,time_total_s,training_iteration,config/lr,config/opt/m,logdir,num_failures,error");
  CHECK_THAT(csv, contains_text("trial_00001,RUNNING,0.25,0.5,1,0.01,0.8,/x/trial_00001,2,\n"));
}

namespace {
std::size_t count_of(std::string const& text, std::string const& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}
}  // namespace

TEST_CASE("the HTML report: the trials table, one plot per metric with a line per trial, nothing from elsewhere", "[report][pure]") {
  // Catches: a page that loads a script, style or font from the network (blank offline), text
  // that is not escaped (a config value that breaks the page), bookkeeping keys plotted, NaN or
  // infinity drawn (an SVG that does not render), a trial with results and no line.
  using cohort::report::trial_row;
  std::vector<trial_row> trials{
      {"trial_00000", "TERMINATED", {{"lr", 0.1}, {"note", "<b>bold</b>"}}, {{"loss", 0.5}, {"training_iteration", 3}}, "/x/trial_00000", "", 0},
      {"trial_00001", "TERMINATED", {{"lr", 0.2}, {"note", "a & b"}}, {{"loss", 0.4}, {"training_iteration", 3}}, "/x/trial_00001", "", 0},
      {"trial_00002", "ERROR", {{"lr", 9.0}, {"note", "x"}}, nlohmann::json::object(), "/x/trial_00002", "diverged: \"loss\" too high", 0}};
  auto row = [](int iteration, double loss) {
    return nlohmann::json{{"loss", loss}, {"training_iteration", iteration}, {"time_total_s", iteration * 0.5}, {"timestamp", 1700000000 + iteration}};
  };
  std::vector<std::vector<nlohmann::json>> histories{
      {row(1, 1.0), row(2, 0.7), row(3, 0.5)},
      {row(1, 0.9), row(2, std::numeric_limits<double>::quiet_NaN()), row(3, 0.4)},
      {}};
  histories[1][2]["eval"] = nlohmann::json{{"acc", 0.8}};  // nested, in one trial only
  auto const page = cohort::report::experiment_html(trials, histories, {.title = "sweep <1>"});
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(count_of(page, "<tr>") == 4);  // header + one per trial
  CHECK_THAT(page, contains_text("<th>config/note</th>"));
  CHECK_THAT(page, contains_text("&lt;b&gt;bold&lt;/b&gt;"));
  CHECK_THAT(page, contains_text("a &amp; b"));
  CHECK_THAT(page, contains_text("diverged: &quot;loss&quot; too high"));
  CHECK_THAT(page, contains_text("<h1>sweep &lt;1&gt;</h1>"));
  CHECK(page.find("<b>") == std::string::npos);
  // Self-contained: no address, script or external resource of any kind.
  for (auto const* outside : {"http", "<script", "src=", "href=", "@import", "url("}) CHECK(page.find(outside) == std::string::npos);
  // Plots: loss and eval/acc, not the bookkeeping keys.
  CHECK(count_of(page, "<svg") == 2);
  CHECK_THAT(page, contains_text("aria-label=\"loss\""));
  CHECK_THAT(page, contains_text("aria-label=\"eval/acc\""));
  CHECK(page.find("aria-label=\"time_total_s\"") == std::string::npos);
  CHECK(page.find("aria-label=\"timestamp\"") == std::string::npos);
  auto const loss_plot = page.substr(page.find("aria-label=\"loss\""), page.find("</svg>", page.find("aria-label=\"loss\"")) - page.find("aria-label=\"loss\""));
  CHECK(count_of(loss_plot, "<polyline") == 2);  // trials 0 and 1; trial 2 reported nothing
  auto const second = loss_plot.substr(loss_plot.find("#ff7f0e"));
  CHECK(count_of(second.substr(0, second.find("/>")), ",") == 2);  // the NaN point left out: two points
  CHECK(page.find("nan") == std::string::npos);  // no NaN or infinite coordinate anywhere
  CHECK(page.find("inf") == std::string::npos);
  // One point: a dot. The cap on plots says how many were left out.
  auto const capped = cohort::report::experiment_html(trials, histories, {.max_plots = 1});
  CHECK(count_of(capped, "<svg") == 1);
  CHECK_THAT(capped, contains_text("1 more metrics are in each trial's result.json."));
  CHECK_THAT(page, contains_text("<circle"));  // eval/acc: one point in one trial
  // A metric with no finite value at all: an empty frame, no NaN or infinite label.
  auto const nothing = cohort::report::experiment_html(
      {trials[0]}, {{nlohmann::json{{"loss", std::numeric_limits<double>::infinity()}, {"training_iteration", 1}}}});
  CHECK(count_of(nothing, "<svg") == 1);
  CHECK(nothing.find("inf") == std::string::npos);
  CHECK(nothing.find("<polyline") == std::string::npos);
  // A long run is thinned to about two points per pixel column, its last point kept; extreme
  // values give an empty frame, not NaN coordinates.
  std::vector<nlohmann::json> long_run;
  for (int i = 1; i <= 5000; ++i) long_run.push_back({{"loss", 1.0 / i}, {"training_iteration", i}});
  long_run.push_back({{"huge", -1.7e308}, {"training_iteration", 5001}});
  long_run.push_back({{"huge", 1.7e308}, {"training_iteration", 5002}});
  auto const thinned = cohort::report::experiment_html({trials[0]}, {long_run}, {.plot_width_px = 300});
  auto const line = thinned.substr(thinned.find("points=\""), thinned.find("\"/>", thinned.find("points=\"")) - thinned.find("points=\""));
  CHECK(count_of(line, ",") <= 2 * 300 + 1);
  CHECK(count_of(line, ",") >= 300);
  CHECK(thinned.find("nan") == std::string::npos);
  CHECK(thinned.find("inf") == std::string::npos);
}

TEST_CASE("evenly_spaced: at most `most` indices, the first and the last among them", "[report][pure]") {
  using cohort::report::evenly_spaced;
  CHECK(evenly_spaced(0, 5).empty());
  CHECK(evenly_spaced(4, 0).empty());
  CHECK(evenly_spaced(3, 5) == std::vector<std::size_t>{0, 1, 2});
  CHECK(evenly_spaced(7, 1) == std::vector<std::size_t>{6});
  CHECK(evenly_spaced(9, 3) == std::vector<std::size_t>{0, 4, 8});
  for (std::size_t n : {10u, 1001u, 25000u}) {
    auto const at = evenly_spaced(n, 600);
    REQUIRE(at.size() == std::min<std::size_t>(n, 600));
    CHECK(at.front() == 0);
    CHECK(at.back() == n - 1);
    CHECK(std::adjacent_find(at.begin(), at.end(), [](auto a, auto b) { return a >= b; }) == at.end());
    if (n > 600) CHECK(at[300] - at[299] <= (n - 1) / 599 + 1);  // even, not bunched
  }
}

TEST_CASE("report.html marks the best trial, draws the configs against the metric, and leaves counters out of the plots", "[report][pure]") {
  // Catches: no best trial (or the wrong direction), a parallel-coordinates view without the
  // metric's axis or with a constant hyperparameter's, counters (epoch) plotted, the tuned
  // metric not first.
  using cohort::report::trial_row;
  std::vector<trial_row> trials{
      {"trial_00000", "TERMINATED", {{"lr", 0.1}, {"opt", "sgd"}, {"seed", 1}}, {{"acc", 0.7}, {"training_iteration", 2}}, "", "", 0},
      {"trial_00001", "TERMINATED", {{"lr", 0.3}, {"opt", "adam"}, {"seed", 1}}, {{"acc", 0.9}, {"training_iteration", 2}}, "", "", 0},
      {"trial_00002", "TERMINATED", {{"lr", 0.2}, {"opt", "sgd"}, {"seed", 1}}, {{"acc", 0.8}, {"training_iteration", 2}}, "", "", 0}};
  auto row = [](int i, double acc, double loss) {
    return nlohmann::json{{"acc", acc}, {"loss", loss}, {"epoch", i - 1}, {"training_iteration", i}};
  };
  std::vector<std::vector<nlohmann::json>> histories{{row(1, 0.5, 2), row(2, 0.7, 1)}, {row(1, 0.6, 2), row(2, 0.9, 1)}, {row(1, 0.6, 2), row(2, 0.8, 1.5)}};
  auto const max = cohort::report::experiment_html(trials, histories, {.metric = "acc", .mode = cohort::max});
  CHECK_THAT(max, contains_text("Best trial: <b>trial_00001</b> with acc = 0.9 (max)"));
  CHECK(count_of(max, "<tr class=\"best\">") == 1);
  CHECK_THAT(max, contains_text("trial_00001 (best)"));
  auto const parallel = max.substr(max.find("aria-label=\"parallel coordinates\""));
  auto const view = parallel.substr(0, parallel.find("</svg>"));
  CHECK(count_of(view, "<polyline") == 3);
  CHECK(count_of(view, "<line ") == 3);  // lr, opt and acc; seed is the same everywhere
  CHECK_THAT(view, contains_text(">opt</text>"));
  CHECK_THAT(view, contains_text(">adam</text>"));
  CHECK(view.find(">seed</text>") == std::string::npos);
  CHECK_THAT(view, contains_text("stroke-width=\"3.5\" stroke=\"#ff7f0e\""));  // the best, trial 1, drawn wider
  CHECK(count_of(max, "<svg") == 3);  // the view, acc, loss; not epoch (a counter)
  CHECK(max.find("aria-label=\"epoch\"") == std::string::npos);
  CHECK(max.find("aria-label=\"acc\"") < max.find("aria-label=\"loss\""));
  auto const min = cohort::report::experiment_html(trials, histories, {.metric = "acc", .mode = cohort::min});
  CHECK_THAT(min, contains_text("Best trial: <b>trial_00000</b> with acc = 0.7 (min)"));
  auto const by_loss = cohort::report::experiment_html(trials, histories, {.metric = "loss", .mode = cohort::min});
  CHECK(by_loss.find("aria-label=\"loss\"") < by_loss.find("aria-label=\"acc\""));  // the tuned metric first
  CHECK(by_loss.find("Best trial") == std::string::npos);  // no trial's last result holds loss
  CHECK(by_loss.find("parallel coordinates") == std::string::npos);
}

TEST_CASE("the current best trial is the first with the best last value of the metric, as Ray's CLIReporter picks it", "[report][pure]") {
  // Catches: the wrong direction, the best over history instead of the last result (Ray's
  // choice), a trial without the metric (or NaN there) taken as the best, a nested metric missed.
  using cohort::report::best_trial_line;
  auto row = [](std::string id, nlohmann::json last) {
    return cohort::report::trial_row{id, "RUNNING", {{"x", id.back() - '0'}}, std::move(last), "", "", 0};
  };
  std::vector<cohort::report::trial_row> trials{
      row("t1", {{"loss", 0.5}, {"m", {{"acc", 0.7}}}}), row("t2", {{"loss", 0.25}, {"m", {{"acc", 0.9}}}}),
      row("t3", {{"loss", std::nan("")}}), row("t4", nlohmann::json::object()), row("t5", {{"loss", 0.25}}),
      row("t6", {{"loss", "low"}})};
  CHECK(best_trial_line(trials, "loss", cohort::min) == "Current best trial: t2 with loss=0.25 and parameters={\"x\":2}\n");
  CHECK(best_trial_line(trials, "loss", cohort::max) == "Current best trial: t1 with loss=0.5 and parameters={\"x\":1}\n");
  CHECK(best_trial_line(trials, "m/acc", cohort::max) == "Current best trial: t2 with m/acc=0.9 and parameters={\"x\":2}\n");
  CHECK(best_trial_line(trials, "accuracy", cohort::max).empty());
  CHECK(best_trial_line(trials, "", cohort::max).empty());
  CHECK(best_trial_line({}, "loss", cohort::min).empty());
}
