#pragma once
/// \file
/// MLflow's REST API as report::mlflow uses it: one libcurl handle talking JSON to a tracking
/// server (keep-alive, a timeout per request), what it answered, and the pure encodings of
/// params (a flattened config), tags and a result's metrics for runs/log-batch.

#include <curl/curl.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/report/flatten.hpp"

namespace cohort::report::detail {

/// What MLflow's REST API answered: the HTTP status (0: no answer, `error` says why) and body.
struct http_answer {
  long status = 0;
  std::string body{};
  std::string error{};
  bool ok() const { return status >= 200 && status < 300; }
  /// No answer, or one worth asking again (the server busy or restarting).
  bool retry() const { return status == 0 || status == 429 || status >= 500; }
};

/// One libcurl handle talking JSON to one server (keep-alive between calls).
class mlflow_http {
 public:
  mlflow_http(std::string base, double timeout_s) : base_(std::move(base)), timeout_ms_(static_cast<long>(timeout_s * 1000)) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    while (!base_.empty() && base_.back() == '/') base_.pop_back();
    curl_ = curl_easy_init();
  }
  mlflow_http(mlflow_http const&) = delete;
  mlflow_http& operator=(mlflow_http const&) = delete;
  ~mlflow_http() {
    if (curl_) curl_easy_cleanup(curl_);
  }

  /// POST `body` to `path` (under /api/2.0/mlflow/), or GET with `body` null.
  http_answer call(std::string const& path, nlohmann::json const* body) {
    http_answer out;
    if (!curl_) {
      out.error = "libcurl could not start";
      return out;
    }
    std::string const url = base_ + "/api/2.0/mlflow/" + path;
    std::string const text = body ? body->dump() : std::string{};
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, timeout_ms_);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms_);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    if (body) {
      curl_easy_setopt(curl_, CURLOPT_POST, 1L);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, text.c_str());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
    }
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t size, std::size_t n, void* to) {
      static_cast<std::string*>(to)->append(p, size * n);
      return size * n;
    });
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &out.body);
    CURLcode const rc = curl_easy_perform(curl_);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      out.error = curl_easy_strerror(rc);
      return out;
    }
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &out.status);
    if (!out.ok()) out.error = "HTTP " + std::to_string(out.status) + ": " + out.body.substr(0, 300);
    return out;
  }

  /// `s` escaped for a query string.
  std::string escape(std::string const& s) {
    char* e = curl_ ? curl_easy_escape(curl_, s.c_str(), static_cast<int>(s.size())) : nullptr;
    std::string out = e ? e : s;
    if (e) curl_free(e);
    return out;
  }

 private:
  std::string base_;
  long timeout_ms_;
  CURL* curl_ = nullptr;
};

/// Pure: MLflow's {"key", "value"} list of a flat string map.
inline nlohmann::json key_values(std::map<std::string, std::string> const& m) {
  nlohmann::json out = nlohmann::json::array();
  for (auto const& [k, v] : m) out.push_back({{"key", k}, {"value", v}});
  return out;
}

/// Pure: a config as MLflow params: flattened keys ("a/b"), values as text (strings unquoted),
/// each at most 6,000 characters (MLflow's limit).
inline std::map<std::string, std::string> params_of(nlohmann::json const& config) {
  std::map<std::string, std::string> out;
  if (!config.is_object()) return out;
  for (auto const& [k, v] : flatten(config)) out[k] = (v.is_string() ? v.get<std::string>() : v.dump()).substr(0, 6000);
  return out;
}

/// One metric value for MLflow's log-batch.
struct mlflow_metric {
  std::string key;
  double value = 0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};

/// Appends to `out` a result's metrics for MLflow: every finite number (a bool as 0 or 1) of the
/// row, nested keys joined with '/' (as flatten()), but the top-level training_iteration (the
/// step) and timestamp, at `step`, stamped `timestamp_ms`. Pure.
inline void append_metrics(std::vector<mlflow_metric>& out, nlohmann::json const& row, std::int64_t step,
                           std::int64_t timestamp_ms, std::string const& prefix = {}) {
  if (!row.is_object()) return;
  for (auto it = row.begin(); it != row.end(); ++it) {
    auto const& v = it.value();
    if (prefix.empty() && (it.key() == "training_iteration" || it.key() == "timestamp")) continue;
    if (v.is_object()) {
      append_metrics(out, v, step, timestamp_ms, prefix + it.key() + "/");
      continue;
    }
    double x = 0;
    if (v.is_boolean()) x = v.get<bool>() ? 1 : 0;
    else if (v.is_number()) x = v.get<double>();
    else continue;
    if (std::isfinite(x)) out.push_back({prefix + it.key(), x, timestamp_ms, step});
  }
}

}  // namespace cohort::report::detail
