#pragma once
/// \file
/// CSV files of numeric columns with a label column.

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::data {

/// Knobs of read_csv.
struct csv_options {
  std::string label_column = "label";  ///< the header name of the integer label column
  char delimiter = ',';
};

/// A numeric table: `features` row-major (rows x columns.size()), `labels` one per row.
struct csv_table {
  std::vector<std::string> columns;  ///< feature column names, in file order
  std::size_t rows = 0;
  std::vector<float> features;
  std::vector<std::int64_t> labels;
};

namespace detail {
inline std::vector<std::string_view> split_fields(std::string_view line, char delim) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    auto pos = line.find(delim, start);
    out.push_back(line.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}
}  // namespace detail

/// Reads a CSV file with a header line. Throws cohort::error naming the file, the line (1-based)
/// and the column for a missing file or label column, a wrong field count, or a field that is
/// not a number (labels: not an integer).
inline csv_table read_csv(std::filesystem::path const& path, csv_options const& options = {}) {
  std::ifstream in(path);
  if (!in) throw cohort::error(path.string() + ": cannot open: check that the file exists and is readable");
  auto fail = [&](std::size_t line, std::string const& what) {
    return cohort::error(path.string() + " line " + std::to_string(line) + ": " + what);
  };
  std::string text;
  if (!std::getline(in, text)) throw fail(1, "no header line: the file is empty");
  std::vector<std::string> header;
  for (auto f : detail::split_fields(text, options.delimiter)) header.emplace_back(detail::trim(f));
  std::size_t label = header.size();
  for (std::size_t c = 0; c < header.size(); ++c)
    if (header[c] == options.label_column) label = c;
  if (label == header.size())
    throw fail(1, "no column named '" + options.label_column + "': set csv_options::label_column to one of the header's names");
  csv_table t;
  for (std::size_t c = 0; c < header.size(); ++c)
    if (c != label) t.columns.push_back(header[c]);
  for (std::size_t line = 2; std::getline(in, text); ++line) {
    if (detail::trim(text).empty()) continue;
    auto fields = detail::split_fields(text, options.delimiter);
    if (fields.size() != header.size())
      throw fail(line, std::to_string(fields.size()) + " fields, the header has " + std::to_string(header.size()));
    for (std::size_t c = 0; c < fields.size(); ++c) {
      auto f = detail::trim(fields[c]);
      if (c == label) {
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
        if (ec != std::errc() || p != f.data() + f.size() || f.empty())
          throw fail(line, "column '" + header[c] + "': '" + std::string(f) + "' is not an integer label");
        t.labels.push_back(v);
      } else {
        float v = 0;
        auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
        if (ec != std::errc() || p != f.data() + f.size() || f.empty())
          throw fail(line, "column '" + header[c] + "': '" + std::string(f) + "' is not a number");
        t.features.push_back(v);
      }
    }
    ++t.rows;
  }
  return t;
}

}  // namespace cohort::data
