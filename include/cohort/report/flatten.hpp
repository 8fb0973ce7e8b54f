#pragma once
/// \file
/// Flattening of nested metrics into "a/b" columns, as Ray's progress.csv does.

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::report {

/// A flattened row: ("outer/inner" key, leaf value) pairs.
using flat_row = std::vector<std::pair<std::string, nlohmann::json>>;

namespace detail {
template <class F>
void visit_leaves(nlohmann::json const& j, std::string& key, F& f) {
  if (!j.is_object()) {
    f(std::as_const(key), j);
    return;
  }
  auto const n = key.size();
  for (auto const& [k, v] : j.get_ref<nlohmann::json::object_t const&>()) {
    if (n > 0) key += '/';
    key += k;
    if (v.is_object() && !v.empty()) visit_leaves(v, key, f);
    else f(std::as_const(key), v);
    key.resize(n);
  }
}
}  // namespace detail

/// Pure: calls `f(key, value)` for each leaf of `j`, as flatten() lists them, without copying:
/// `key` (std::string const&) lives until f returns, `value` as long as `j`.
template <class F>
void for_each_leaf(nlohmann::json const& j, F&& f) {
  std::string key;
  detail::visit_leaves(j, key, f);
}

/// Pure: nested objects become "outer/inner" keys, in the object's (sorted) key order; arrays and
/// scalars are leaves.
inline flat_row flatten(nlohmann::json const& j, std::string const& prefix = {}) {
  flat_row out;
  std::string key = prefix;
  auto add = [&](std::string const& k, nlohmann::json const& v) { out.emplace_back(k, v); };
  detail::visit_leaves(j, key, add);
  return out;
}

/// Pure: one CSV field for a JSON value (strings unquoted unless they need quoting).
inline std::string csv_field(nlohmann::json const& v) {
  std::string s = v.is_string() ? v.get<std::string>() : (v.is_null() ? std::string{} : v.dump());
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace cohort::report
