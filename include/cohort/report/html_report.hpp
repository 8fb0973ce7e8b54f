#pragma once
/// \file
/// cohort::report::experiment_html: an experiment as one self-contained HTML page (what Ray's
/// JupyterNotebookReporter shows, kept as a file, report.html beside trials.csv): the best trial,
/// the trials table as trials.csv has it (the best trial marked), a parallel-coordinates view of
/// the hyperparameters against the tuned metric, then one SVG plot per metric with every trial's
/// results against training_iteration (the tuned metric first; counters such as an epoch number
/// left out). No script, style sheet, font or image from anywhere else: the page opens offline
/// and can be mailed or archived as it is.

#include "cohort/order.hpp"
#include "cohort/report/flatten.hpp"
#include "cohort/report/trial_table.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::report {

/// The knobs of experiment_html.
struct html_options {
  std::string title = "cohort experiment";  ///< the page's heading
  std::string metric{};                     ///< the tuned metric (tune_config::metric): best trial, parallel coordinates
  cohort::order mode = cohort::order::max;  ///< which end of `metric` is best
  std::size_t max_plots = 16;               ///< metrics plotted at most (in name order)
  int plot_width_px = 520;
  int plot_height_px = 260;
};

/// How many of a trial's results report.html draws at most: two per pixel column of a plot (a
/// long run's line looks the same, the page stays small), evenly spaced (evenly_spaced).
inline std::size_t points_per_line(html_options const& o) { return 2 * static_cast<std::size_t>(std::max(1, o.plot_width_px)); }

/// Pure: at most `most` of the indices 0 .. n - 1, evenly spaced, the first and the last
/// included (all of them when n <= most; none when most is 0).
inline std::vector<std::size_t> evenly_spaced(std::size_t n, std::size_t most) {
  std::vector<std::size_t> out;
  if (n == 0 || most == 0) return out;
  if (n <= most || most == 1) {
    for (std::size_t i = n <= most ? 0 : n - 1; i < n; ++i) out.push_back(i);
    return out;
  }
  out.reserve(most);
  for (std::size_t k = 0; k < most; ++k) out.push_back(k * (n - 1) / (most - 1));
  return out;
}

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
                                          "node_ip", "date", "num_failures"};
  return keys.count(k) > 0 || k.rfind("config/", 0) == 0;
}

/// A distinct colour per trial (Tableau 10, as matplotlib and TensorBoard use), cycled.
inline char const* colour_of(std::size_t i) {
  static char const* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return palette[i % 10];
}

inline std::string number(double v) { return general(v, 4); }

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
    std::string points;  // every point: experiment_html draws at most points_per_line results of a trial
    for (auto const& [x, y] : lines[t]) points += number(px(x)) + "," + number(py(y)) + " ";
    if (lines[t].size() == 1)  // one point: a dot, a polyline of one point draws nothing
      s += "<circle cx=\"" + number(px(lines[t][0].first)) + "\" cy=\"" + number(py(lines[t][0].second)) + "\" r=\"3\" fill=\"" +
           colour_of(t) + "\"/>";
    else
      s += "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" + std::string(colour_of(t)) + "\" points=\"" + points + "\"/>";
  }
  return s + "</svg>";
}

/// Pure: whether a metric's per-trial points are a counter (an epoch or step number): integers,
/// never decreasing within any trial. Counters are not plotted.
inline bool is_counter(std::vector<std::vector<std::pair<double, double>>> const& per_trial) {
  bool any = false;
  for (auto const& points : per_trial)
    for (std::size_t i = 0; i < points.size(); ++i) {
      double const y = points[i].second;
      if (y != std::floor(y) || (i > 0 && y < points[i - 1].second)) return false;
      any = true;
    }
  return any;
}

/// The parallel-coordinates view: an axis per hyperparameter that differs between trials
/// (numbers on their range, anything else as evenly spaced categories in sorted order), the
/// tuned metric's axis last; a line per trial with a finite value of the metric, in its colour,
/// the best trial's (index `best`) drawn wider. Empty without such a trial.
inline std::string svg_parallel(std::vector<trial_row> const& trials, std::string const& metric, std::size_t best,
                                html_options const& o) {
  struct axis {
    std::string name;
    std::vector<std::optional<nlohmann::json>> values;  // per trial
    bool numeric = true;
    double low = INFINITY, high = -INFINITY;
    std::vector<std::string> categories{};
    axis(std::string n, std::size_t trials) : name(std::move(n)), values(trials) {}
  };
  std::vector<axis> axes;
  std::map<std::string, std::size_t> axis_of;
  for (std::size_t t = 0; t < trials.size(); ++t)
    for_each_leaf(trials[t].config, [&](std::string const& k, nlohmann::json const& v) {
      auto [it, fresh] = axis_of.emplace(k, axes.size());
      if (fresh) axes.emplace_back(k, trials.size());
      axes[it->second].values[t] = v;
    });
  axis m(metric, trials.size());
  std::vector<bool> drawn(trials.size(), false);
  for (std::size_t t = 0; t < trials.size(); ++t)
    for_each_leaf(trials[t].last, [&](std::string const& k, nlohmann::json const& v) {
      if (k == metric && v.is_number() && std::isfinite(v.get<double>())) {
        m.values[t] = v;
        drawn[t] = true;
      }
    });
  if (std::none_of(drawn.begin(), drawn.end(), [](bool d) { return d; })) return "";
  std::erase_if(axes, [&](axis const& a) {  // the same in every drawn trial: nothing to compare
    std::optional<nlohmann::json> first;
    for (std::size_t t = 0; t < trials.size(); ++t) {
      if (!drawn[t]) continue;
      if (!first) first = a.values[t];
      else if (a.values[t] != *first) return false;
    }
    return true;
  });
  axes.push_back(std::move(m));
  for (auto& a : axes) {
    std::set<std::string> cats;
    for (std::size_t t = 0; t < trials.size(); ++t) {
      if (!drawn[t] || !a.values[t]) continue;
      auto const& v = *a.values[t];
      if (v.is_number() && std::isfinite(v.get<double>())) {
        a.low = std::min(a.low, v.get<double>()), a.high = std::max(a.high, v.get<double>());
      } else {
        a.numeric = false;
      }
      cats.insert(v.is_string() ? v.get<std::string>() : v.dump());
    }
    if (!a.numeric) a.categories.assign(cats.begin(), cats.end());
  }
  double const left = 40, right = 40, top = 36, bottom = 36;
  int const width = std::max(o.plot_width_px, 140 * static_cast<int>(axes.size()));
  double const w = width - left - right, h = o.plot_height_px - top - bottom;
  auto ax = [&](std::size_t i) { return axes.size() == 1 ? left + w / 2 : left + w * static_cast<double>(i) / static_cast<double>(axes.size() - 1); };
  auto ay = [&](axis const& a, nlohmann::json const& v) {  // 0 at the bottom, 1 at the top
    double f = 0.5;
    if (a.numeric) f = a.high > a.low ? (v.get<double>() - a.low) / (a.high - a.low) : 0.5;
    else if (a.categories.size() > 1) {
      auto const text = v.is_string() ? v.get<std::string>() : v.dump();
      auto const at = std::find(a.categories.begin(), a.categories.end(), text) - a.categories.begin();
      f = static_cast<double>(at) / static_cast<double>(a.categories.size() - 1);
    }
    return top + (1 - f) * h;
  };
  std::string svg = "<svg width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(o.plot_height_px) +
                    "\" role=\"img\" aria-label=\"parallel coordinates\">";
  for (std::size_t i = 0; i < axes.size(); ++i) {
    auto const& a = axes[i];
    svg += "<line x1=\"" + number(ax(i)) + "\" y1=\"" + number(top) + "\" x2=\"" + number(ax(i)) + "\" y2=\"" + number(top + h) +
           "\" stroke=\"#999\"/>";
    svg += "<text x=\"" + number(ax(i)) + "\" y=\"" + number(top - 18) + "\" text-anchor=\"middle\" font-weight=\"bold\">" +
           html_escape(a.name) + "</text>";
    if (a.numeric) {
      svg += "<text x=\"" + number(ax(i)) + "\" y=\"" + number(top - 4) + "\" text-anchor=\"middle\">" + number(a.high) + "</text>";
      svg += "<text x=\"" + number(ax(i)) + "\" y=\"" + number(top + h + 14) + "\" text-anchor=\"middle\">" + number(a.low) + "</text>";
    } else {
      for (auto const& c : a.categories)
        svg += "<text x=\"" + number(ax(i) + 4) + "\" y=\"" + number(ay(a, nlohmann::json(c)) + 4) + "\">" + html_escape(c) + "</text>";
    }
  }
  auto line = [&](std::size_t t) {
    std::string points;
    for (std::size_t i = 0; i < axes.size(); ++i)
      if (axes[i].values[t]) points += number(ax(i)) + "," + number(ay(axes[i], *axes[i].values[t])) + " ";
    return "<polyline fill=\"none\" stroke-width=\"" + std::string(t == best ? "3.5" : "1.5") + "\" stroke=\"" + colour_of(t) +
           "\" points=\"" + points + "\"/>";
  };
  for (std::size_t t = 0; t < trials.size(); ++t)
    if (drawn[t] && t != best) svg += line(t);
  if (best < trials.size() && drawn[best]) svg += line(best);  // on top
  return svg + "</svg>";
}

}  // namespace detail

/// The page: the best trial by o.metric and o.mode (best_trial), the trials table (trials.csv's
/// cells, cells_of; each trial's colour beside its id, the best one marked), the parallel
/// coordinates of the hyperparameters against o.metric (detail::svg_parallel), then a plot per
/// numeric metric of `histories` (the results of trials[i] in histories[i]; o.metric first, then
/// by name; bookkeeping keys and counters left out; at most o.max_plots) against
/// training_iteration, from at most points_per_line(o) results per trial. NaN and infinite
/// values are not drawn. Pure.
inline std::string experiment_html(std::vector<trial_row> const& trials, std::vector<std::vector<nlohmann::json>> const& histories,
                                   html_options const& o = {}) {
  using detail::html_escape;
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(o.title) +
                     "</title><style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:13px}"
                     "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#eee}"
                     "td:first-child,td:nth-child(2){text-align:left}svg{margin:6px;font-size:11px}"
                     ".swatch{display:inline-block;width:10px;height:10px;margin-right:4px}tr.best td{font-weight:bold;background:#fff6d6}"
                     "</style></head><body>\n";
  page += "<h1>" + html_escape(o.title) + "</h1>\n";
  auto const best = best_trial(trials, o.metric, o.mode);
  if (best)
    page += "<p>Best trial: <b>" + html_escape(trials[best->first].id) + "</b> with " + html_escape(o.metric) + " = " +
            detail::number(best->second) + " (" + (o.mode == cohort::order::max ? "max" : "min") + ")</p>\n";
  // The table: trials.csv's cells.
  auto const cells = cells_of(trials);
  page += "<table>\n<tr>";
  for (auto const& c : cells.columns) page += "<th>" + html_escape(c) + "</th>";
  page += "</tr>\n";
  for (std::size_t r = 0; r < cells.rows.size(); ++r) {
    bool const is_best = best && best->first == r;
    page += is_best ? "<tr class=\"best\">" : "<tr>";
    for (std::size_t c = 0; c < cells.columns.size(); ++c) {
      std::string text = html_escape(cells.cell(r, c));
      if (c == 0) text = "<span class=\"swatch\" style=\"background:" + std::string(detail::colour_of(r)) + "\"></span>" + text;
      if (c == 0 && is_best) text += " (best)";
      page += "<td>" + text + "</td>";
    }
    page += "</tr>\n";
  }
  page += "</table>\n";
  if (best) page += detail::svg_parallel(trials, o.metric, best->first, o) + "\n";
  // The plots: each result flattened once, its numeric values by metric.
  std::map<std::string, std::vector<std::vector<std::pair<double, double>>>> lines;  // metric -> trial -> points
  for (std::size_t t = 0; t < histories.size(); ++t)
    for (std::size_t const i : evenly_spaced(histories[t].size(), points_per_line(o))) {
      auto const& row = histories[t][i];
      double x = static_cast<double>(i + 1);
      if (auto it = row.find("training_iteration"); it != row.end() && it->is_number()) x = it->get<double>();
      for_each_leaf(row, [&](std::string const& k, nlohmann::json const& v) {
        if (!v.is_number() || detail::bookkeeping_key(k)) return;
        auto& per_trial = lines[k];
        per_trial.resize(histories.size());
        if (double const y = v.get<double>(); std::isfinite(x) && std::isfinite(y)) per_trial[t].emplace_back(x, y);
      });
    }
  std::vector<std::string> order;  // the tuned metric first, then by name; counters left out
  if (lines.contains(o.metric)) order.push_back(o.metric);
  for (auto const& [m, per_trial] : lines)
    if (m != o.metric && !detail::is_counter(per_trial)) order.push_back(m);
  for (std::size_t i = 0; i < order.size() && i < o.max_plots; ++i) page += detail::svg_plot(order[i], lines.at(order[i]), o) + "\n";
  if (order.size() > o.max_plots)
    page += "<p>" + std::to_string(order.size() - o.max_plots) + " more metrics are in each trial's result.json.</p>\n";
  return page + "</body></html>\n";
}

}  // namespace cohort::report
