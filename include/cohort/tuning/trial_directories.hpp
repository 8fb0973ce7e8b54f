#pragma once
/// \file
/// A tuning experiment's trial directories as the book of trials handles them: trial ids, PBT's
/// checkpoint clones and superseded lineages, and on resuming the directories
/// experiment_state.json does not list (resumed when the same config comes again, else set
/// aside, never deleted).

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/detail/utc_stamp.hpp"

namespace cohort::tuning::detail {

/// The id of the n-th trial: trial_00000, trial_00001, ...
inline std::string trial_id(std::size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "trial_%05zu", n);
  return buf;
}

/// PBT: copies the latest good checkpoint of trial `donor` into trial `into`'s directory (the
/// donor's retention may delete its own copy at any time) as exploit_<n>_<donor>_<name>, `n`
/// the experiment's count of clones (`clones`, advanced first), and returns the copy's path;
/// nothing when the donor has none (`clones` unchanged) or the copy fails.
inline std::optional<std::string> clone_checkpoint(std::filesystem::path const& exp, std::string const& donor,
                                                   std::string const& into, std::size_t& clones) {
  auto from = cohort::checkpointing::latest_good(exp / donor);
  if (!from) return std::nullopt;
  auto dest = exp / into / ("exploit_" + std::to_string(++clones) + "_" + donor + "_" + from->path().filename().string());
  std::error_code ec;
  std::filesystem::create_directories(dest.parent_path(), ec);
  std::filesystem::copy(from->path(), dest, std::filesystem::copy_options::recursive, ec);
  if (ec || cohort::checkpointing::verify(dest)) {
    std::filesystem::remove_all(dest, ec);
    return std::nullopt;
  }
  return dest.string();
}

/// PBT: the committed checkpoints of a trial that continues from a donor's belong to the
/// abandoned lineage: kept, moved under its superseded/ (suffixed _<n>).
inline void supersede_checkpoints(std::filesystem::path const& trial_dir, std::size_t n) {
  std::error_code ec;
  auto old = cohort::checkpointing::committed(trial_dir);
  if (!old.empty()) std::filesystem::create_directories(trial_dir / "superseded", ec);
  for (auto const& dir : old)
    std::filesystem::rename(dir, trial_dir / "superseded" / (dir.filename().string() + "_" + std::to_string(n)), ec);
}

/// On resuming: the trial directories of `exp` that experiment_state.json does not list (begun
/// after its last write; the searcher suggests them again under the same ids).
template <class Known>
std::set<std::string> unlisted_trials(std::filesystem::path const& exp, Known const& known) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto const& entry : std::filesystem::directory_iterator(exp, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("trial_", 0) == 0 && name.size() == 11 && !known.contains(name)) out.insert(name);
  }
  return out;
}

/// Whether the unlisted trial directory `dir` is the one of a trial suggested again with
/// `config`: its params.json holds exactly that config. Then the trial resumes in it, from its
/// latest checkpoint (the trainer's own resume), instead of starting over.
inline bool same_trial(std::filesystem::path const& dir, nlohmann::json const& config) {
  std::ifstream in(dir / "params.json", std::ios::binary);
  auto const params = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !params.is_discarded() && params == config;
}

/// Moves a trial directory aside as <id><why><time> (kept, not deleted), if it exists.
inline void set_aside(std::filesystem::path const& exp, std::string const& id, char const* why) {
  std::error_code ec;
  if (std::filesystem::exists(exp / id, ec)) std::filesystem::rename(exp / id, exp / (id + why + cohort::detail::utc_stamp()), ec);
}
/// Moves an unlisted trial directory that is not resumed aside as <id>.orphaned_<time> (kept, not
/// deleted): its checkpoints may belong to another config.
inline void set_aside_orphan(std::filesystem::path const& exp, std::string const& id) { set_aside(exp, id, ".orphaned_"); }

}  // namespace cohort::tuning::detail
