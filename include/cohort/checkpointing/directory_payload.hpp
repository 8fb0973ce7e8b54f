#pragma once
/// \file
/// A checkpoint the training function wrote itself, as a directory (Ray's
/// `report(metrics, checkpoint=Checkpoint.from_directory(dir))`): copied into the run's
/// checkpoint_<iteration> in checkpoint_mode::sync and async (Ray's upload), or, in
/// checkpoint_mode::no_upload, renamed to it where it lies inside the run directory (no byte
/// copied: Ray's NO_UPLOAD, the checkpoint stays on the storage where it was written; moved back
/// if the checkpoint is not committed). Either way it is then committed as any checkpoint: listed
/// with sizes and checksums in its manifest, fsynced, kept or deleted by the retention policy,
/// resumed from.

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"

namespace cohort::checkpointing {

/// Why `dir` cannot be a directory checkpoint of the run at `run_path`; nothing when it can. It
/// must be an absolute or relative path without a ".." component (a link before one would lead
/// elsewhere than the path reads), a directory (not a symbolic link) holding only directories and
/// regular files (a checkpoint holds plain files, and a link could lead anywhere) and no
/// manifest.json at its top (the name of the checkpoint's own manifest). It must neither hold the
/// run directory nor lie inside the run's own checkpoint_*, .staging or .trash. With `in_place`
/// (no_upload) it must also lie inside `run_path`, with no link on the way.
inline std::optional<std::string> directory_checkpoint_problem(std::filesystem::path const& dir,
                                                                std::filesystem::path const& run_path, bool in_place) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto const& part : dir)
    if (part == "..")
      return "checkpoint directory " + dir.string() + " has a '..' component: pass the path without it";
  auto const plain = [&](fs::path const& p) {  // lexically absolute: a link on the way is seen below, not resolved away
    auto out = fs::absolute(p, ec).lexically_normal();
    return out.has_filename() ? out : out.parent_path();  // "a/b/" as "a/b"
  };
  auto const where = plain(dir), run = plain(run_path);
  auto const type = fs::symlink_status(where, ec).type();
  if (type == fs::file_type::not_found)
    return "checkpoint directory " + dir.string() + " does not exist: write the checkpoint's files there before report()";
  if (type == fs::file_type::symlink)
    return "checkpoint directory " + dir.string() + " is a symbolic link: pass the directory it points to";
  if (type != fs::file_type::directory)
    return "checkpoint directory " + dir.string() + " is not a directory" + (ec ? " (" + ec.message() + ")" : std::string()) +
           ": pass the directory the checkpoint's files are in";
  auto const rel = where.lexically_relative(run);
  auto const first = rel.empty() ? std::string() : rel.begin()->string();
  bool const inside = !rel.empty() && first != "." && first != "..";
  auto const up = run.lexically_relative(where);  // "." or a/b when dir is the run or holds it
  if (!inside && !up.empty() && up.begin()->string() != "..")
    return "checkpoint directory " + dir.string() + " holds the run directory " + run.string() +
           ": write the checkpoint in a directory of its own";
  if (inside && (first == ".staging" || first == ".trash" || first.rfind("checkpoint_", 0) == 0))
    return "checkpoint directory " + dir.string() + " is inside the run's own " + first +
           ": write it in a directory of its own under ctx.run_path()";
  if (in_place) {
    if (!inside)
      return "checkpoint_mode::no_upload moves the checkpoint within the run directory, and " + dir.string() +
             " is outside " + run.string() + ": write it under ctx.run_path(), or use checkpoint_mode::sync to copy it";
    fs::path at = run;
    for (auto const& part : rel) {
      at /= part;
      if (fs::symlink_status(at, ec).type() == fs::file_type::symlink)
        return "checkpoint directory " + dir.string() + " is reached through the symbolic link " + at.string() +
               ": write it in a plain directory under ctx.run_path()";
    }
  }
  if (fs::symlink_status(where / "manifest.json", ec).type() != fs::file_type::not_found)
    return "checkpoint directory " + dir.string() +
           " has a manifest.json at its top, the name of the checkpoint's own manifest (a committed checkpoint passed "
           "again?): rename that file";
  for (auto it = fs::recursive_directory_iterator(where, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    auto const t = it->symlink_status(ec).type();
    if (t == fs::file_type::symlink)
      return it->path().string() +
             ": a symbolic link in the checkpoint directory (a checkpoint holds directories and regular files only): put a "
             "copy of what it points to there instead";
    if (t != fs::file_type::directory && t != fs::file_type::regular)
      return it->path().string() + ": not a regular file, in the checkpoint directory (a checkpoint holds directories and "
                                   "regular files only): remove it";
  }
  if (ec) return "cannot read checkpoint directory " + dir.string() + ": " + ec.message();
  return std::nullopt;
}

/// The payload of a directory checkpoint: rank 0 moves (`in_place`) or copies `dir` into the
/// staging directory report() gives it, after directory_checkpoint_problem found nothing (else a
/// cohort::error, which report() turns into an error on every rank). A moved directory is moved
/// back by `undo` when the checkpoint is not committed. Only rank 0's directory is read: files of
/// other ranks reach the checkpoint when they wrote them into that directory before report()
/// (storage every rank sees; report() agrees before writing).
inline checkpoint_payload directory_payload(std::filesystem::path dir, std::filesystem::path run_path, bool in_place) {
  namespace fs = std::filesystem;
  std::error_code ec;
  dir = fs::absolute(dir, ec);  // async mode reads it later, maybe after a change of directory
  checkpoint_payload p{[dir, run_path = std::move(run_path), in_place](fs::path const& staging, int rank) {
    if (rank != 0) return;
    if (auto problem = directory_checkpoint_problem(dir, run_path, in_place)) throw cohort::error(*problem);
    std::error_code ec;
    if (in_place) {
      fs::rename(dir, staging, ec);  // staging is an empty directory: replaced, on the same file system
      if (ec)
        throw cohort::error("cannot move " + dir.string() + " to " + staging.string() + " (" + ec.message() +
                            "): keep it on the run directory's file system, or use checkpoint_mode::sync to copy it");
      return;
    }
    // Links stay links (and fail the commit's listing) rather than being followed, should one
    // appear after the check.
    fs::copy(dir, staging, fs::copy_options::recursive | fs::copy_options::overwrite_existing | fs::copy_options::copy_symlinks,
             ec);
    if (ec) throw cohort::error("cannot copy " + dir.string() + " to " + staging.string() + ": " + ec.message());
  }};
  if (in_place)
    p.undo = [dir](fs::path const& staging, int rank) {
      std::error_code ec;
      if (rank != 0 || !fs::exists(staging, ec) || fs::exists(dir, ec)) return;
      fs::remove(staging / "manifest.json", ec);  // the commit's, if it got that far (dir had none)
      fs::rename(staging, dir, ec);
    };
  return p;
}

}  // namespace cohort::checkpointing
