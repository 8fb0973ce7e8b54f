#pragma once
/// \file
/// cohort::report::mlflow: a callback (report/callbacks.hpp) that logs an experiment to an MLflow
/// tracking server over its REST API (libcurl; link cohort::mlflow). A trainer's run is one MLflow
/// run; a tuner's experiment is a parent run with one nested run per trial (Ray's
/// MLflowLoggerCallback). Params are the trial's config (flattened, "a/b"), metrics every numeric
/// value of each result at step training_iteration, tags the host, the world size, the LibTorch
/// version where LibTorch is in the program, the best committed checkpoint's path by the metric
/// (`cohort.checkpoint`; `mlflow::metric`, else the tuner's) and the newest's
/// (`cohort.latest_checkpoint`). Server down or slow: one warning; what it did not take waits in order
/// (up to max_buffered_metrics; beyond, the oldest metrics are dropped, counted and said) and goes
/// out once it answers again. It runs on the callbacks' thread, never on a training thread.

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/order.hpp"
#include "cohort/report/best_checkpoint.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/report/flatten.hpp"
#include "cohort/report/mlflow_rest.hpp"

#if defined(COHORT_WITH_TORCH) && __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

namespace cohort::report {

namespace detail {

/// The MLflow side of one experiment: runs made, and what waits to be sent, in order.
struct mlflow_session {
  struct op {
    enum kind_t { run, batch, update } kind = batch;
    std::string trial{};                  ///< whose run ("" for the parent)
    nlohmann::json body{};                ///< the request, less its run ids and metrics
    std::vector<mlflow_metric> metrics{};  ///< batch: its metrics (JSON only when sent)
  };
  std::unique_ptr<mlflow_http> http{};
  std::string experiment_id{};
  std::map<std::string, std::string> run_ids{};  ///< trial ("" for the parent run) -> MLflow run id
  std::deque<op> ops{};
  std::size_t waiting_metrics = 0, dropped_metrics = 0, rejected = 0;
  bool down = false, tuning = false;
  std::chrono::steady_clock::time_point next_try{};   ///< while down: when to ask again
  std::chrono::steady_clock::time_point next_send{};  ///< results wait until then (send_interval_s)
};

/// What report::mlflow keeps between events.
struct mlflow_state {
  std::shared_ptr<mlflow_session> s{};  ///< from on_experiment_start to on_experiment_end
  std::string experiment{};
  std::map<std::string, std::string> base_tags{};
  std::string metric{};  ///< the metric that picks each trial's best checkpoint (empty: the newest)
  cohort::order mode = cohort::min;
  std::map<std::string, best_checkpoint> best{};  ///< by trial
};

inline std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown");
}

}  // namespace detail

/// The MLflow callback (see the file comment). Knobs as Ray's MLflowLoggerCallback where they
/// exist: `tracking_uri` (http://host:port of `mlflow server`), `experiment_name` (empty: the
/// run's or the tuner's name), `tags` added to every run.
struct mlflow {
  std::string tracking_uri = "http://127.0.0.1:5000";  ///< the tracking server
  std::string experiment_name{};                       ///< MLflow experiment; empty: run_config::name
  std::map<std::string, std::string> tags{};           ///< added to every run
  std::size_t max_buffered_metrics = 1'000'000;        ///< metrics kept while the server is away
  double timeout_s = 5;                                ///< per request
  double send_interval_s = 0.2;                        ///< results are sent together this often (bench_tune callbacks/2: +1.3 µs a report)
  double retry_interval_s = 1;                         ///< between tries while the server is away
  double end_timeout_s = 20;                           ///< at the end, how long the last sends may keep trying (less than the callbacks' drain_timeout)
  /// The metric whose best value picks the checkpoint tagged `cohort.checkpoint`; empty: the
  /// tuner's tune_config::metric and mode, and for a trainer's run the newest checkpoint.
  std::string metric{};
  cohort::order mode = cohort::min;  ///< with `metric`: which end is best

  void on_experiment_start(experiment_info const& e) {
    state_.s = std::make_shared<detail::mlflow_session>();
    state_.s->http = std::make_unique<detail::mlflow_http>(tracking_uri, timeout_s);
    state_.s->tuning = e.tuning;
    state_.experiment = experiment_name.empty() ? e.name : experiment_name;
    state_.base_tags = tags;
    state_.base_tags["host"] = detail::host_name();
    state_.base_tags["world_size"] = std::to_string(e.world_size);
    state_.metric = metric.empty() ? e.metric : metric;
    state_.mode = metric.empty() ? e.mode : mode;
    state_.best.clear();
#ifdef TORCH_VERSION
    state_.base_tags["libtorch"] = TORCH_VERSION;
#endif
    if (e.tuning) {  // the parent run of the experiment's trials
      auto t = state_.base_tags;
      t["cohort.experiment_path"] = e.path.string();
      push({.kind = detail::mlflow_session::op::run, .trial = "", .body = {{"run_name", e.name}, {"tags", detail::key_values(t)}}});
    }
    pump();
  }

  void on_trial_start(trial_info const& t) { start_run(t); }
  void on_trial_restore(trial_info const& t, std::filesystem::path const&) { start_run(t); }

  void on_trial_result(trial_info const& t, nlohmann::json const& row) {
    if (!state_.s) return;
    best_of(t.id).observe(row);
    auto const step = row.value("training_iteration", std::int64_t{0});
    std::int64_t const stamp = row.contains("timestamp") && row["timestamp"].is_number() ? row["timestamp"].get<std::int64_t>() * 1000 : detail::now_ms();
    auto& ops = state_.s->ops;
    if (ops.empty() || ops.back().kind != op::batch || ops.back().trial != t.id || ops.back().metrics.size() >= 900 ||
        !ops.back().body.empty())
      push({.kind = op::batch, .trial = t.id});  // MLflow takes at most 1,000 metrics per request
    auto& metrics = ops.back().metrics;
    auto const before = metrics.size();
    detail::append_metrics(metrics, row, step, stamp);
    state_.s->waiting_metrics += metrics.size() - before;
    drop_over_bound();
    // Results go out together, every send_interval_s (or 900 metrics): one request, not one per report.
    auto const now = std::chrono::steady_clock::now();
    if (now >= state_.s->next_send || metrics.size() >= 900) {
      state_.s->next_send = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(send_interval_s));
      pump();
    }
  }

  void on_checkpoint(trial_info const& t, std::filesystem::path const& dir) {
    if (!state_.s) return;
    std::map<std::string, std::string> tags{{"cohort.latest_checkpoint", dir.string()}};
    auto const name = dir.filename().string();  // checkpoint_NNNNNN
    auto const iteration = name.size() > 11 ? std::strtoll(name.c_str() + 11, nullptr, 10) : 0;
    if (best_of(t.id).is_new_best(iteration)) tags["cohort.checkpoint"] = dir.string();
    push({.kind = detail::mlflow_session::op::batch, .trial = t.id, .body = {{"tags", detail::key_values(tags)}}});
    pump();
  }

  void on_trial_complete(trial_info const& t) { end_run(t.id, "FINISHED"); }
  void on_trial_error(trial_info const& t, std::string const&) { end_run(t.id, "FAILED"); }

  void on_experiment_end(experiment_info const&) {
    if (!state_.s) return;
    if (state_.s->tuning) end_run("", "FINISHED");
    auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double>(end_timeout_s);
    while (!state_.s->ops.empty() && std::chrono::steady_clock::now() < until) {
      pump();
      if (!state_.s->ops.empty()) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(retry_interval_s, 0.2)));
    }
    if (!state_.s->ops.empty())
      std::cerr << "[cohort] MLflow at " << tracking_uri << " did not take the experiment's last " << state_.s->waiting_metrics
                << " metrics within " << end_timeout_s << " s; they are lost (result.json has them)\n";
    if (state_.s->dropped_metrics > 0)
      std::cerr << "[cohort] MLflow: " << state_.s->dropped_metrics << " metrics dropped while the server was away (more than "
                << max_buffered_metrics << " waiting; raise mlflow.max_buffered_metrics)\n";
    state_.s.reset();
  }

  /// Metrics not sent yet (waiting for the server), and dropped (the buffer was full).
  std::size_t waiting_metrics() const { return state_.s ? state_.s->waiting_metrics : 0; }

 private:
  using op = detail::mlflow_session::op;

  detail::best_checkpoint& best_of(std::string const& trial) {
    auto [it, added] = state_.best.try_emplace(trial);
    if (added) it->second = {.metric = state_.metric, .mode = state_.mode};
    return it->second;
  }

  void start_run(trial_info const& t) {
    if (!state_.s || state_.s->run_ids.contains(t.id)) return;  // a restored trial goes on in its run
    bool queued = false;
    for (auto const& o : state_.s->ops) queued = queued || (o.kind == op::run && o.trial == t.id);
    if (queued) return;
    auto tg = state_.base_tags;
    tg["cohort.trial_path"] = t.path.string();
    nlohmann::json body{{"run_name", t.id}, {"tags", detail::key_values(tg)}};
    auto params = detail::params_of(t.config);
    push({.kind = op::run, .trial = t.id, .body = std::move(body)});
    std::map<std::string, std::string> chunk;
    for (auto const& [k, v] : params) {  // MLflow takes at most 100 params per request
      chunk[k] = v;
      if (chunk.size() == 100) push({.kind = op::batch, .trial = t.id, .body = {{"params", detail::key_values(std::exchange(chunk, {}))}}});
    }
    if (!chunk.empty()) push({.kind = op::batch, .trial = t.id, .body = {{"params", detail::key_values(chunk)}}});
    pump();
  }

  void end_run(std::string const& trial, std::string const& status) {
    if (!state_.s) return;
    push({.kind = op::update, .trial = trial, .body = {{"status", status}}});
    pump();
  }

  void push(op o) {
    state_.s->waiting_metrics += o.metrics.size();
    state_.s->ops.push_back(std::move(o));
  }

  /// Over the bound: the oldest metrics go first (runs, params, tags and ends are kept).
  void drop_over_bound() {
    auto& s = *state_.s;
    for (auto it = s.ops.begin(); s.waiting_metrics > max_buffered_metrics && it != s.ops.end(); ++it) {
      s.dropped_metrics += it->metrics.size();
      s.waiting_metrics -= it->metrics.size();
      it->metrics = {};
    }
  }

  /// Sends what waits, in order, until the server fails to answer (then waits retry_interval_s).
  void pump() {
    auto& s = *state_.s;
    if (s.down && std::chrono::steady_clock::now() < s.next_try) return;
    bool const was_down = s.down;
    std::size_t sent = 0;
    while (!s.ops.empty()) {
      auto answer = send(s.ops.front());
      if (!answer.ok() && answer.retry()) {
        if (!s.down)
          std::cerr << "[cohort] MLflow at " << tracking_uri << " does not answer (" << answer.error
                    << "); training goes on, metrics wait and are sent when it is back\n";
        s.down = true;
        s.next_try = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(retry_interval_s));
        break;
      }
      if (!answer.ok() && s.rejected++ == 0)  // the request itself is wrong: asking again will not help
        std::cerr << "[cohort] MLflow at " << tracking_uri << " refused a request (" << answer.error
                  << "); it is skipped (later refusals are not reported)\n";
      sent += s.ops.front().metrics.size();
      s.waiting_metrics -= s.ops.front().metrics.size();
      s.ops.pop_front();
      s.down = false;
    }
    if (was_down && !s.down) std::cerr << "[cohort] MLflow at " << tracking_uri << " answers again; " << sent << " waiting metrics sent\n";
  }

  /// One waiting request: its run made first (and the experiment), then sent.
  detail::http_answer send(op const& o) {
    auto& s = *state_.s;
    if (s.experiment_id.empty()) {
      auto got = s.http->call("experiments/get-by-name?experiment_name=" + s.http->escape(state_.experiment), nullptr);
      if (got.ok()) {
        s.experiment_id = nlohmann::json::parse(got.body).at("experiment").at("experiment_id").get<std::string>();
      } else if (got.status == 404) {
        nlohmann::json const body{{"name", state_.experiment}};
        auto made = s.http->call("experiments/create", &body);
        if (!made.ok()) return made;
        s.experiment_id = nlohmann::json::parse(made.body).at("experiment_id").get<std::string>();
      } else {
        return got;
      }
    }
    if (o.kind == op::run) {
      auto body = o.body;
      body["experiment_id"] = s.experiment_id;
      body["start_time"] = detail::now_ms();
      if (!o.trial.empty() && s.tuning) {
        auto parent = s.run_ids.find("");
        if (parent == s.run_ids.end()) return {.status = 400, .error = "no parent run"};
        body["tags"].push_back({{"key", "mlflow.parentRunId"}, {"value", parent->second}});
      }
      auto made = s.http->call("runs/create", &body);
      if (made.ok()) s.run_ids[o.trial] = nlohmann::json::parse(made.body).at("run").at("info").at("run_id").get<std::string>();
      return made;
    }
    auto run = s.run_ids.find(o.trial);
    if (run == s.run_ids.end()) return {.status = 400, .error = "no run for " + o.trial};
    auto body = o.body;
    body["run_id"] = run->second;
    if (o.kind == op::update) {
      body["end_time"] = detail::now_ms();
      return s.http->call("runs/update", &body);
    }
    if (!o.metrics.empty()) {
      auto& list = body["metrics"] = nlohmann::json::array();
      for (auto const& m : o.metrics) list.push_back({{"key", m.key}, {"value", m.value}, {"timestamp", m.timestamp_ms}, {"step", m.step}});
    }
    if (body.contains("metrics") || body.contains("params") || body.contains("tags")) return s.http->call("runs/log-batch", &body);
    return {.status = 200};
  }


 public:
  /// The session with the server, the experiment's name and the tags of every run (not a knob;
  /// only mlflow reaches it).
  cohort::detail::internal_state<detail::mlflow_state, mlflow> state_{};
};
static_assert(cohort::callback<mlflow>);

}  // namespace cohort::report
