#pragma once
/// \file
/// A checkpoint the training function wrote itself, as a directory (Ray's
/// `report(metrics, checkpoint=Checkpoint.from_directory(dir))`): copied into the run's
/// checkpoint_<iteration> in checkpoint_mode::sync and async (Ray's upload), or, in
/// checkpoint_mode::no_upload, renamed to it where it lies inside the run directory (no byte
/// copied: Ray's NO_UPLOAD, the checkpoint stays on the storage where it was written). Either way
/// it is then committed as any checkpoint: listed with sizes and checksums in its manifest,
/// fsynced, kept or deleted by the retention policy, resumed from.

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"

namespace cohort::checkpointing {

/// Why `dir` cannot be a directory checkpoint; nothing when it can. It must be a directory (not a
/// symbolic link) holding only directories and regular files (a checkpoint holds plain files, and
/// a link could lead anywhere). With `in_place` (no_upload) it must also lie inside `run_path`,
/// below none of the run's own entries (checkpoint_*, .staging, .trash), with no link on the way.
inline std::optional<std::string> directory_checkpoint_problem(std::filesystem::path const& dir,
                                                                std::filesystem::path const& run_path, bool in_place) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto const type = fs::symlink_status(dir, ec).type();
  if (type == fs::file_type::not_found)
    return "checkpoint directory " + dir.string() + " does not exist: write the checkpoint's files there before report()";
  if (type == fs::file_type::symlink)
    return "checkpoint directory " + dir.string() + " is a symbolic link: pass the directory itself";
  if (type != fs::file_type::directory) return "checkpoint directory " + dir.string() + " is not a directory";
  if (in_place) {
    // Lexically, both made absolute: a link on the way is then seen below, not resolved away.
    auto const plain = [&](fs::path const& p) {
      auto out = fs::absolute(p, ec).lexically_normal();
      return out.has_filename() ? out : out.parent_path();  // "a/b/" as "a/b"
    };
    auto const run = plain(run_path);
    auto const rel = plain(dir).lexically_relative(run);
    auto const first = rel.empty() ? std::string() : rel.begin()->string();
    if (rel.empty() || first == "." || first == "..")
      return "checkpoint_mode::no_upload moves the checkpoint within the run directory, and " + dir.string() +
             " is outside " + run.string() + ": write it under ctx.run_path(), or use checkpoint_mode::sync to copy it";
    if (first == ".staging" || first == ".trash" || first.rfind("checkpoint_", 0) == 0)
      return "checkpoint directory " + dir.string() + " is inside the run's own " + first +
             ": write it in a directory of its own under ctx.run_path()";
    fs::path at = run;
    for (auto const& part : rel) {
      at /= part;
      if (fs::symlink_status(at, ec).type() == fs::file_type::symlink)
        return "checkpoint directory " + dir.string() + " is reached through the symbolic link " + at.string() +
               ": write it in a plain directory under ctx.run_path()";
    }
  }
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    auto const t = it->symlink_status(ec).type();
    if (t != fs::file_type::directory && t != fs::file_type::regular)
      return it->path().string() + ": " + (t == fs::file_type::symlink ? "a symbolic link" : "not a regular file") +
             " in the checkpoint directory (a checkpoint holds directories and regular files only)";
  }
  if (ec) return "cannot read checkpoint directory " + dir.string() + ": " + ec.message();
  return std::nullopt;
}

/// The payload of a directory checkpoint: rank 0 moves (`in_place`) or copies `dir` into the
/// staging directory report() gives it, after directory_checkpoint_problem found nothing (else
/// a cohort::error, which report() turns into an error on every rank). Other ranks add nothing:
/// files they wrote into `dir` before report() go with it (report() agrees before writing).
inline checkpoint_payload directory_payload(std::filesystem::path dir, std::filesystem::path run_path, bool in_place) {
  return {[dir = std::move(dir), run_path = std::move(run_path), in_place](std::filesystem::path const& staging, int rank) {
    namespace fs = std::filesystem;
    if (rank != 0) return;
    if (auto problem = directory_checkpoint_problem(dir, run_path, in_place)) throw cohort::error(*problem);
    std::error_code ec;
    if (in_place) {
      fs::rename(dir, staging, ec);  // staging is an empty directory: replaced, on the same file system
      if (ec) throw cohort::error("cannot move " + dir.string() + " to " + staging.string() + ": " + ec.message());
      return;
    }
    fs::copy(dir, staging, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    if (ec) throw cohort::error("cannot copy " + dir.string() + " to " + staging.string() + ": " + ec.message() + ": check free space");
  }};
}

}  // namespace cohort::checkpointing
