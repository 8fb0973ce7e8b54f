#pragma once
/// \file
/// An experiment's experiment_state.json and its trials' result.json, as the tuner reads them
/// back to resume: pure functions from text to structs, without MPI, that check what another
/// user or job may have written before the tuner acts on it (the fuzz target fuzz/tune_state.cpp
/// calls them on arbitrary bytes).

#include <cstddef>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"
#include "cohort/tuning/decision.hpp"

namespace cohort::tuning::detail {

/// One trial as the coordinator tracks it.
struct trial_state {
  std::string id;
  std::string status = "PENDING";  ///< PENDING, RUNNING, PAUSED, TERMINATED, ERROR
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json saved_last = nlohmann::json::object();  ///< the last result as experiment_state.json had it
  std::vector<nlohmann::json> history;
  std::string restore_from;     ///< a checkpoint to start from (PBT's clone of a donor's)
  std::string error;
  std::size_t failures = 0;     ///< times its functor threw (each retried while tune_config.max_failures allows)
  bool resumed_after_pause = false;
  std::int64_t told_checkpoint = 0;  ///< the newest checkpoint callbacks were told of (not saved)
  std::optional<scheduling_decision> exploit;  ///< set between an exploit decision and the trial's end
  /// The checkpoint directories (names) its run retained, as the run that ended it said (not
  /// saved): the result grid takes them instead of listing its directory. Unset where that run
  /// did not end cleanly or a later change (a restart from a donor) may have followed it.
  std::optional<std::vector<std::string>> retained_at_end;

  /// The trial's last result (empty before its first).
  nlohmann::json const& last() const { return history.empty() ? saved_last : history.back(); }
};

/// A trial in experiment_state.json: everything but its history, which its own result.json holds.
inline void to_json(nlohmann::json& j, trial_state const& t) {
  j = {{"id", t.id}, {"status", t.status}, {"config", t.config}, {"last", t.last()},
       {"restore_from", t.restore_from}, {"error", t.error}, {"failures", t.failures}};
}

/// experiment_state.json's text: `head` (every field but "trials") with "trials" the list of
/// `trials`, each a trial's to_json() as JSON text. The same text as the whole object's dump():
/// "trials" sorts last among its keys.
inline std::string experiment_state_text(nlohmann::json const& head, std::vector<std::shared_ptr<std::string const>> const& trials) {
  std::string out = head.dump();
  std::size_t bytes = out.size() + 16;
  for (auto const& t : trials) bytes += t->size() + 1;
  out.reserve(bytes);
  out.pop_back();  // the closing brace
  out += out.size() > 1 ? ",\"trials\":[" : "\"trials\":[";
  for (std::size_t i = 0; i < trials.size(); ++i) {
    if (i) out += ',';
    out += *trials[i];
  }
  out += "]}";
  return out;
}

/// experiment_state.json: what the coordinator wrote at its last state write.
struct experiment_state {
  nlohmann::json searcher;          ///< the searcher's save_state()
  nlohmann::json scheduler;         ///< the scheduler's save_state()
  std::size_t next_trial = 0;       ///< the number of the next new trial: above every listed trial's
  bool searcher_exhausted = false;  ///< the searcher had nothing more to suggest
  std::vector<trial_state> trials;  ///< in the order they began; ids unique, each trial_NNNNN
};

/// What every error about an experiment's state file ends with.
inline constexpr char const* experiment_state_fix =
    ": move it aside to start the experiment afresh, or use another run_config.name";

/// The number of a trial id as trial_id() makes it ("trial_00042": 42), or nothing for any other
/// string (a name that could lead outside the experiment's directory among them).
inline std::optional<std::size_t> trial_number(std::string_view id) {
  if (id.size() < 11 || id.size() > 25 || id.substr(0, 6) != "trial_") return std::nullopt;
  std::size_t n = 0;
  for (char c : id.substr(6)) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  return n;
}

/// Parses the text of experiment_state.json (`file` names it in errors) and checks it: a JSON
/// object with "searcher" and "scheduler", a trial count "next_trial", and "trials", each with
/// an id trial_NNNNN below next_trial (unique), a known status, a config, an object last
/// result, optional strings restore_from (a checkpoint in the trial's own directory, taken
/// by name under the file's directory) and error, and an optional failure count. Throws cohort::error naming the file
/// and the field otherwise; the searcher's and scheduler's states are checked by restore_policies.
inline experiment_state parse_experiment_state(std::string_view text, std::filesystem::path const& file) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (std::exception const& e) {
    throw cohort::error(file.string() + " does not parse (" + e.what() + ")" + experiment_state_fix);
  }
  auto bad = [&](std::string const& what) { return cohort::error(file.string() + ": " + what + experiment_state_fix); };
  if (!state.is_object()) throw bad("it is not a JSON object");
  experiment_state out;
  for (char const* key : {"searcher", "scheduler", "next_trial", "trials"})
    if (!state.contains(key)) throw bad(std::string("field '") + key + "' is missing");
  out.searcher = state["searcher"];
  out.scheduler = state["scheduler"];
  if (!state["next_trial"].is_number_unsigned()) throw bad("field 'next_trial' is " + state["next_trial"].dump() + ", not a trial count");
  out.next_trial = state["next_trial"].get<std::size_t>();
  if (state.contains("searcher_exhausted")) {
    if (!state["searcher_exhausted"].is_boolean()) throw bad("field 'searcher_exhausted' is not true or false");
    out.searcher_exhausted = state["searcher_exhausted"].get<bool>();
  }
  if (!state["trials"].is_array()) throw bad("field 'trials' is not a list");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < state["trials"].size(); ++i) {
    auto const& j = state["trials"][i];
    auto const field = "trials[" + std::to_string(i) + "]";
    if (!j.is_object()) throw bad("field '" + field + "' is not a JSON object");
    // A string field: "" when absent (optional_string), an error (required_string).
    auto optional_string = [&](char const* key) {
      if (!j.contains(key)) return std::string{};
      if (!j[key].is_string()) throw bad("field '" + field + "." + key + "' is not a string");
      return j[key].get<std::string>();
    };
    auto required_string = [&](char const* key) {
      if (!j.contains(key)) throw bad("field '" + field + "." + key + "' is missing");
      return optional_string(key);
    };
    trial_state t;
    t.id = required_string("id");
    auto const number = trial_number(t.id);
    if (!number) throw bad("field '" + field + ".id' is " + nlohmann::json(t.id).dump() + ", not a trial id like trial_00001");
    if (*number >= out.next_trial)
      throw bad("field '" + field + ".id' is " + t.id + ", not below next_trial " + std::to_string(out.next_trial));
    if (!seen.insert(t.id).second) throw bad("field '" + field + ".id': trial " + t.id + " is listed twice");
    t.status = required_string("status");
    if (t.status != "PENDING" && t.status != "RUNNING" && t.status != "PAUSED" && t.status != "TERMINATED" && t.status != "ERROR")
      throw bad("field '" + field + ".status' is " + nlohmann::json(t.status).dump() +
                ", not PENDING, RUNNING, PAUSED, TERMINATED or ERROR");
    if (!j.contains("config")) throw bad("field '" + field + ".config' is missing");
    if (!j.contains("last") || !j["last"].is_object()) throw bad("field '" + field + ".last' is missing or not a JSON object");
    t.config = j["config"];
    t.saved_last = j["last"];
    t.restore_from = optional_string("restore_from");
    if (!t.restore_from.empty()) {
      // PBT's clone of a donor's checkpoint, always made in the trial's own directory: only its
      // name is taken, under this experiment's directory (never a path from the file).
      std::filesystem::path const from(t.restore_from);
      auto const name = from.filename().string();
      if (from.parent_path().filename() != t.id || name.empty() || name == "." || name == ".." ||
          name.find_first_of(std::string_view("\\\0", 2)) != std::string::npos)
        throw bad("field '" + field + ".restore_from' is " + nlohmann::json(t.restore_from).dump() +
                  ", not a checkpoint in the trial's own directory " + t.id);
      t.restore_from = (file.parent_path() / t.id / name).string();
    }
    t.error = optional_string("error");
    if (j.contains("failures")) {
      if (!j["failures"].is_number_unsigned())
        throw bad("field '" + field + ".failures' is " + j["failures"].dump() + ", not a failure count");
      t.failures = j["failures"].get<std::size_t>();
    }
    out.trials.push_back(std::move(t));
  }
  return out;
}

/// Reads and parses experiment_state.json (see parse_experiment_state).
inline experiment_state read_experiment_state(std::filesystem::path const& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw cohort::error(file.string() + ": cannot open" + experiment_state_fix);
  std::string const text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_experiment_state(text, file);
}

/// The rows of a trial's result.json text: one JSON object per line; a line that is not one (cut
/// short by a crash) is skipped.
inline std::vector<nlohmann::json> parse_result_rows(std::string_view text) {
  std::vector<nlohmann::json> rows;
  while (!text.empty()) {
    auto const end = text.find('\n');
    auto row = nlohmann::json::parse(text.substr(0, end), nullptr, false);
    if (row.is_object()) rows.push_back(std::move(row));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
  }
  return rows;
}

/// The rows of the result.json in the trial directory `dir` (parse_result_rows; none when there
/// is no such file).
inline std::vector<nlohmann::json> read_result_rows(std::filesystem::path const& dir) {
  std::ifstream in(dir / "result.json", std::ios::binary);
  return parse_result_rows(std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()});
}

/// Restores `searcher` and `scheduler` (after their setup) from a parsed state of `file`. A
/// state of the wrong shape (a missing key, a string for a number) is a cohort::error naming the
/// file and the field, never another exception; the policies' own cohort::errors (another
/// searcher's state, a changed space, other knobs) pass through.
template <class Searcher, class Scheduler>
void restore_policies(experiment_state const& state, Searcher& searcher, Scheduler& scheduler, std::filesystem::path const& file) {
  auto restore = [&](char const* field, auto&& fn) {
    try {
      fn();
    } catch (nlohmann::json::exception const& e) {
      throw cohort::error(file.string() + ": field '" + field + "' is not the state this " + field + " saved (" + e.what() +
                          ")" + experiment_state_fix);
    }
  };
  restore("searcher", [&] { searcher.restore_state(state.searcher); });
  restore("scheduler", [&] { scheduler.restore_state(state.scheduler); });
}

}  // namespace cohort::tuning::detail
