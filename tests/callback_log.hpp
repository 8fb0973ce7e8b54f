#pragma once
// A callback for the tests: logs every event it is told, in a log its copies share.

#include <cohort/report/callbacks.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace cohort_test {

/// Logs each event as "event trial detail": "start NAME [(tuning)]", "trial ID CONFIG",
/// "restore ID CHECKPOINT", "result ID ITERATION", "checkpoint ID CHECKPOINT", "complete ID",
/// "error ID: WHY", "end NAME".
struct event_log {
  std::shared_ptr<std::vector<std::string>> log = std::make_shared<std::vector<std::string>>();
  void on_experiment_start(cohort::report::experiment_info const& e) {
    log->push_back("start " + e.name + (e.tuning ? " (tuning)" : ""));
  }
  void on_trial_start(cohort::report::trial_info const& t) { log->push_back("trial " + t.id + " " + t.config.dump()); }
  void on_trial_restore(cohort::report::trial_info const& t, std::filesystem::path const& c) {
    log->push_back("restore " + t.id + " " + c.filename().string());
  }
  void on_trial_result(cohort::report::trial_info const& t, nlohmann::json const& r) {
    log->push_back("result " + t.id + " " + r.value("training_iteration", nlohmann::json()).dump());
  }
  void on_checkpoint(cohort::report::trial_info const& t, std::filesystem::path const& c) {
    log->push_back("checkpoint " + t.id + " " + c.filename().string());
  }
  void on_trial_complete(cohort::report::trial_info const& t) { log->push_back("complete " + t.id); }
  void on_trial_error(cohort::report::trial_info const& t, std::string const& e) { log->push_back("error " + t.id + ": " + e); }
  void on_experiment_end(cohort::report::experiment_info const& e) { log->push_back("end " + e.name); }
};

}  // namespace cohort_test
