#pragma once
/// \file
/// cohort::report::experiment_html: an experiment as one self-contained HTML page (what Ray's
/// JupyterNotebookReporter shows, kept as a file, report.html beside trials.csv): the trials
/// table as trials.csv has it, then one SVG plot per metric with every trial's results against
/// training_iteration. No script, style sheet, font or image from anywhere else: the page opens
/// offline and can be mailed or archived as it is.

#include "cohort/report/flatten.hpp"
#include "cohort/report/trial_table.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::report {

/// The knobs of experiment_html.
struct html_options {
  std::string title = "cohort experiment";  ///< the page's heading
  std::size_t max_plots = 16;               ///< metrics plotted at most (in name order)
  int plot_width_px = 520;
  int plot_height_px = 260;
};

namespace detail {

/// `s` with &, <, >, " and ' escaped: safe as element text and as a quoted attribute.
inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  return out;
}

/// Keys every report carries (Ray's auto-filled results): in the table, not plotted.
inline bool bookkeeping_key(std::string const& k) {
  static std::set<std::string> const keys{"training_iteration", "time_this_iter_s", "time_total_s", "timestamp",
                                          "trial_id", "done", "iterations_since_restore", "pid", "hostname",
                                          "node_ip", "date"};
  return keys.count(k) > 0 || k.rfind("config/", 0) == 0;
}

/// A distinct colour per trial (Tableau 10, as matplotlib and TensorBoard use), cycled.
inline char const* colour_of(std::size_t i) {
  static char const* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return palette[i % 10];
}

inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// One metric's plot: a polyline per trial through its finite (iteration, value) points.
inline std::string svg_plot(std::string const& metric, std::vector<std::vector<std::pair<double, double>>> const& lines,
                            html_options const& o) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (auto const& l : lines)
    for (auto [x, y] : l) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no finite point: an empty frame
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.05);
  bool const drawable = std::isfinite(x1 - x0) && x1 > x0 && std::isfinite(y1 - y0) && y1 > y0;
  if (!drawable) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // values too extreme to scale: an empty frame
  double const left = 64, right = 12, top = 24, bottom = 28;
  double const w = o.plot_width_px - left - right, h = o.plot_height_px - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * w; };
  auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * h; };
  std::string s = "<svg width=\"" + std::to_string(o.plot_width_px) + "\" height=\"" +
                  std::to_string(o.plot_height_px) + "\" role=\"img\" aria-label=\"" + html_escape(metric) + "\">";
  s += "<text x=\"" + number(left) + "\" y=\"16\" font-weight=\"bold\">" + html_escape(metric) + "</text>";
  s += "<rect x=\"" + number(left) + "\" y=\"" + number(top) + "\" width=\"" + number(w) + "\" height=\"" + number(h) +
       "\" fill=\"none\" stroke=\"#999\"/>";
  s += "<text x=\"" + number(left - 4) + "\" y=\"" + number(top + 10) + "\" text-anchor=\"end\">" + number(y1) + "</text>";
  s += "<text x=\"" + number(left - 4) + "\" y=\"" + number(top + h) + "\" text-anchor=\"end\">" + number(y0) + "</text>";
  s += "<text x=\"" + number(left) + "\" y=\"" + number(top + h + 18) + "\">" + number(x0) + "</text>";
  s += "<text x=\"" + number(left + w) + "\" y=\"" + number(top + h + 18) + "\" text-anchor=\"end\">" + number(x1) +
       " training_iteration</text>";
  for (std::size_t t = 0; t < lines.size() && drawable; ++t) {
    if (lines[t].empty()) continue;
    std::string points;
    // At most about two points per pixel column: a long run's line looks the same, the page stays small.
    auto const columns = static_cast<std::size_t>(2 * std::max(1, o.plot_width_px));
    auto const stride = std::max<std::size_t>(1, (lines[t].size() + columns - 1) / columns);
    for (std::size_t i = 0; i < lines[t].size(); i += stride) {
      auto const [x, y] = lines[t][i + stride >= lines[t].size() ? lines[t].size() - 1 : i];  // the last point always drawn
      points += number(px(x)) + "," + number(py(y)) + " ";
    }
    if (lines[t].size() == 1)  // one point: a dot, a polyline of one point draws nothing
      s += "<circle cx=\"" + number(px(lines[t][0].first)) + "\" cy=\"" + number(py(lines[t][0].second)) + "\" r=\"3\" fill=\"" +
           colour_of(t) + "\"/>";
    else
      s += "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" + std::string(colour_of(t)) + "\" points=\"" + points + "\"/>";
  }
  return s + "</svg>";
}

}  // namespace detail

/// The page: the trials table (trials.csv's cells, cells_of; each trial's colour beside its id), then a
/// plot per numeric metric of `histories` (the results of trials[i] in histories[i]; bookkeeping
/// keys left out; at most o.max_plots) against training_iteration. NaN and infinite values are
/// not drawn. Pure.
inline std::string experiment_html(std::vector<trial_row> const& trials, std::vector<std::vector<nlohmann::json>> const& histories,
                                   html_options const& o = {}) {
  using detail::html_escape;
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(o.title) +
                     "</title><style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:13px}"
                     "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#eee}"
                     "td:first-child,td:nth-child(2){text-align:left}svg{margin:6px;font-size:11px}"
                     ".swatch{display:inline-block;width:10px;height:10px;margin-right:4px}</style></head><body>\n";
  page += "<h1>" + html_escape(o.title) + "</h1>\n";
  // The table: trials.csv's cells.
  auto const cells = cells_of(trials);
  page += "<table>\n<tr>";
  for (auto const& c : cells.columns) page += "<th>" + html_escape(c) + "</th>";
  page += "</tr>\n";
  for (std::size_t r = 0; r < cells.rows.size(); ++r) {
    page += "<tr>";
    for (std::size_t c = 0; c < cells.columns.size(); ++c) {
      auto const it = cells.rows[r].find(cells.columns[c]);
      std::string text = it == cells.rows[r].end() ? "" : html_escape(it->second);
      if (c == 0) text = "<span class=\"swatch\" style=\"background:" + std::string(detail::colour_of(r)) + "\"></span>" + text;
      page += "<td>" + text + "</td>";
    }
    page += "</tr>\n";
  }
  page += "</table>\n";
  // The plots: each result flattened once, its numeric values by metric.
  std::map<std::string, std::vector<std::vector<std::pair<double, double>>>> lines;  // metric -> trial -> points
  for (std::size_t t = 0; t < histories.size(); ++t)
    for (std::size_t i = 0; i < histories[t].size(); ++i) {
      auto const flat = flatten(histories[t][i]);
      double x = static_cast<double>(i + 1);
      for (auto const& [k, v] : flat)
        if (k == "training_iteration" && v.is_number()) x = v.get<double>();
      for (auto const& [k, v] : flat) {
        if (!v.is_number() || detail::bookkeeping_key(k)) continue;
        auto& per_trial = lines[k];
        per_trial.resize(histories.size());
        if (double const y = v.get<double>(); std::isfinite(x) && std::isfinite(y)) per_trial[t].emplace_back(x, y);
      }
    }
  std::size_t plotted = 0;
  for (auto const& [m, per_trial] : lines) {
    if (plotted++ == o.max_plots) break;
    page += detail::svg_plot(m, per_trial, o) + "\n";
  }
  if (lines.size() > o.max_plots)
    page += "<p>" + std::to_string(lines.size() - o.max_plots) + " more metrics are in each trial's result.json.</p>\n";
  return page + "</body></html>\n";
}

}  // namespace cohort::report
