#pragma once
/// \file
/// The tuner's console status table (Ray's CLIReporter) and its experiment-level CSV (Ray's
/// results_df): pure functions of the trial list, so they are tested without running anything.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/order.hpp"
#include "cohort/report/flatten.hpp"

namespace cohort::report {

/// One trial as the table and the CSV see it.
struct trial_row {
  std::string id;                                ///< e.g. "trial_00003"
  std::string status;                            ///< PENDING, RUNNING, PAUSED, TERMINATED, ERROR
  nlohmann::json config = nlohmann::json::object();  ///< the trial's current hyperparameters
  nlohmann::json last = nlohmann::json::object();    ///< its last result (empty before the first)
  std::string path;                              ///< the trial directory
  std::string error;                             ///< why it failed, if it did
  std::size_t failures = 0;                      ///< times its functor threw (tune_config::max_failures)
};

namespace detail {

/// `v` as printf's %.<digits>g writes it (std::to_chars: the same text, without printf's cost).
inline std::string general(double v, int digits) {
  char buf[32];
  auto const end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, digits).ptr;
  return std::string(buf, end);
}

inline std::string cell(nlohmann::json const& v) {
  if (v.is_null()) return "";
  if (v.is_number_float()) return general(v.get<double>(), 5);
  if (v.is_number_integer()) return v.is_number_unsigned() ? std::to_string(v.get<std::uint64_t>()) : std::to_string(v.get<std::int64_t>());
  return v.is_string() ? v.get<std::string>() : v.dump();
}

inline std::map<std::string, nlohmann::json> flat_map(nlohmann::json const& j) {
  std::map<std::string, nlohmann::json> out;
  for (auto& [k, v] : flatten(j)) out.emplace(k, v);
  return out;
}

/// Appends `s` to `out` as a CSV cell: as it is, or quoted where it holds a comma, a quote or a
/// line break.
inline void append_csv_cell(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\n") == std::string_view::npos) {
    out += s;
    return;
  }
  out += '"';
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

}  // namespace detail

/// What the status table shows besides the trials (Ray's CLIReporter's header and row limit).
struct table_options {
  std::string metric{};                     ///< the metric column and the best trial's metric; empty: neither
  cohort::order mode = cohort::order::max;  ///< which end of `metric` is best
  std::string scheduler{};                  ///< the scheduler's lines (its debug_string(): ASHA's brackets), or empty
  std::size_t max_rows = 20;                ///< trials shown; the rest summarised in one line
};

/// The first trial whose last result has the best `metric` (an "a/b" path into nested results)
/// in the direction `mode`, as Ray's CLIReporter picks it, and that value. Nothing when no trial
/// has reported `metric` as a number (NaN never wins), or `metric` is empty. Pure.
inline std::optional<std::pair<std::size_t, double>> best_trial(std::vector<trial_row> const& trials, std::string const& metric,
                                                                cohort::order mode) {
  if (metric.empty()) return std::nullopt;
  std::optional<std::pair<std::size_t, double>> best;
  for (std::size_t i = 0; i < trials.size(); ++i)
    for_each_leaf(trials[i].last, [&](std::string const& k, nlohmann::json const& value) {
      if (k != metric || !value.is_number()) return;
      double const v = value.get<double>();
      if (v != v) return;  // NaN: never the best
      if (!best || (mode == cohort::order::max ? v > best->second : v < best->second)) best = {i, v};
    });
  return best;
}

/// Ray's "Current best trial: <id> with <metric>=<value> and parameters=<config>" (best_trial);
/// empty when there is none.
inline std::string best_trial_line(std::vector<trial_row> const& trials, std::string const& metric, cohort::order mode) {
  auto const best = best_trial(trials, metric, mode);
  if (!best) return "";
  auto const& t = trials[best->first];
  return "Current best trial: " + t.id + " with " + metric + "=" + detail::cell(best->second) +
         " and parameters=" + t.config.dump() + "\n";
}

/// The status table: a header line with trial counts by status, the scheduler's lines, the
/// current best trial (best_trial_line), then one row per trial (trial, status, each
/// hyperparameter, the metric, iterations, total time), at most `max_rows` rows (the rest
/// summarised in one line), running trials first, then paused, pending, finished, errored.
inline std::string trial_table(std::vector<trial_row> const& trials, double elapsed_s, table_options const& options) {
  auto const& metric = options.metric;
  auto const max_rows = options.max_rows;
  std::map<std::string, int> counts;
  std::vector<std::string> params;
  for (auto const& t : trials) {
    ++counts[t.status];
    for (auto const& [k, v] : flatten(t.config))
      if (std::find(params.begin(), params.end(), k) == params.end()) params.push_back(k);
  }
  std::vector<std::string> head{"trial", "status"};
  head.insert(head.end(), params.begin(), params.end());
  if (!metric.empty()) head.push_back(metric);
  head.push_back("iter");
  head.push_back("total time (s)");
  bool const any_failed = std::any_of(trials.begin(), trials.end(), [](auto const& t) { return t.failures > 0; });
  if (any_failed) head.push_back("failures");

  auto rank_of = [](std::string const& s) {
    static std::string const by_status[] = {"RUNNING", "PAUSED", "PENDING", "TERMINATED", "ERROR"};
    for (int i = 0; i < 5; ++i)
      if (s == by_status[i]) return i;
    return 5;
  };
  std::vector<trial_row const*> shown;
  for (auto const& t : trials) shown.push_back(&t);
  std::stable_sort(shown.begin(), shown.end(), [&](auto* a, auto* b) { return rank_of(a->status) < rank_of(b->status); });
  std::size_t const hidden = shown.size() > max_rows ? shown.size() - max_rows : 0;
  shown.resize(std::min(shown.size(), max_rows));

  std::vector<std::vector<std::string>> cells{head};
  for (auto const* t : shown) {
    auto config = detail::flat_map(t->config);
    auto last = detail::flat_map(t->last);
    std::vector<std::string> row{t->id, t->status};
    for (auto const& p : params) row.push_back(config.contains(p) ? detail::cell(config[p]) : "");
    if (!metric.empty()) row.push_back(last.contains(metric) ? detail::cell(last[metric]) : "");
    row.push_back(last.contains("training_iteration") ? detail::cell(last["training_iteration"]) : "");
    row.push_back(last.contains("time_total_s") ? detail::cell(last["time_total_s"]) : "");
    if (any_failed) row.push_back(t->failures > 0 ? std::to_string(t->failures) : "");
    cells.push_back(std::move(row));
  }
  std::vector<std::size_t> width(head.size(), 0);
  for (auto const& r : cells)
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::string rule = "+";
  for (auto w : width) rule += std::string(w + 2, '-') + "+";

  char line[160];
  std::snprintf(line, sizeof line, "== Status == running for %.1f s; %zu trials:", elapsed_s, trials.size());
  std::string out = line;
  for (auto const& [status, n] : counts) out += " " + std::to_string(n) + " " + status;
  out += "\n";
  if (!options.scheduler.empty()) out += options.scheduler + (options.scheduler.back() == '\n' ? "" : "\n");
  out += best_trial_line(trials, metric, options.mode);
  out += rule + "\n";
  for (std::size_t r = 0; r < cells.size(); ++r) {
    out += "|";
    for (std::size_t i = 0; i < cells[r].size(); ++i)
      out += " " + cells[r][i] + std::string(width[i] - cells[r][i].size(), ' ') + " |";
    out += "\n";
    if (r == 0) out += rule + "\n";
  }
  out += rule + "\n";
  if (hidden > 0) out += "... " + std::to_string(hidden) + " more trials not shown\n";
  return out;
}

/// One row per trial with its last result flattened (a/b keys), its hyperparameters as
/// config/<key>, trial_id, status, logdir (and error, where one failed): the cells of trials.csv
/// and of the HTML report's table. `columns` in first-seen order; a row lacks the keys it has not.
struct trial_cells {
  std::vector<std::string> columns{"trial_id", "status"};
  /// Per trial, its cells by column (rows[t][c] under columns[c]); a row shorter than columns
  /// has no cell in the columns past its end.
  std::vector<std::vector<std::string>> rows;

  /// Trial `t`'s cell in column `c`, empty where it has none.
  std::string_view cell(std::size_t t, std::size_t c) const { return c < rows[t].size() ? std::string_view(rows[t][c]) : std::string_view(); }
};

namespace detail {
inline trial_row const& row_ref(trial_row const& r) { return r; }
inline trial_row const& row_ref(std::shared_ptr<trial_row const> const& r) { return *r; }
}  // namespace detail

/// The cells of `trials`, trial_rows or shared pointers to them (see trial_cells).
template <class Rows>
trial_cells cells_of(Rows const& trials) {
  trial_cells out;
  out.rows.reserve(trials.size());
  std::unordered_map<std::string, std::size_t> column_of{{"trial_id", 0}, {"status", 1}};
  auto add = [&](std::vector<std::string>& row, std::string const& k, std::string v) {
    auto const [it, fresh] = column_of.try_emplace(k, out.columns.size());
    if (fresh) out.columns.push_back(k);
    if (row.size() <= it->second) row.resize(it->second + 1);
    row[it->second] = std::move(v);
  };
  std::string config_key = "config/";
  for (auto const& each : trials) {
    trial_row const& t = detail::row_ref(each);
    auto& row = out.rows.emplace_back(std::vector<std::string>{t.id, t.status});
    row.reserve(out.columns.size());
    for_each_leaf(t.last, [&](std::string const& k, nlohmann::json const& v) { add(row, k, detail::cell(v)); });
    for_each_leaf(t.config, [&](std::string const& k, nlohmann::json const& v) {
      config_key.resize(7);
      add(row, config_key += k, detail::cell(v));
    });
    add(row, "logdir", t.path);
    if (t.failures > 0) add(row, "num_failures", std::to_string(t.failures));
    if (!t.error.empty()) add(row, "error", t.error);
  }
  return out;
}

/// The experiment-level CSV (Ray's ResultGrid.get_dataframe()): cells_of(trials), a header line
/// and a line per trial.
template <class Rows>
std::string trials_csv(Rows const& trials) {
  auto const cells = cells_of(trials);
  std::string out;
  for (std::size_t i = 0; i < cells.columns.size(); ++i) {
    if (i) out += ',';
    detail::append_csv_cell(out, cells.columns[i]);
  }
  out += '\n';
  for (std::size_t t = 0; t < cells.rows.size(); ++t) {
    for (std::size_t i = 0; i < cells.columns.size(); ++i) {
      if (i) out += ',';
      detail::append_csv_cell(out, cells.cell(t, i));
    }
    out += '\n';
  }
  return out;
}

}  // namespace cohort::report
