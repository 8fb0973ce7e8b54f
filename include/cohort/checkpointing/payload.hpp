#pragma once
/// \file
/// What a report carries to be checkpointed: a function that writes this rank's files.

#include <filesystem>
#include <functional>

namespace cohort {

/// The files of one checkpoint, as written by one rank: `write(dir, rank)` puts them into `dir`
/// (shared by all ranks of the trainer; use distinct names per rank for per-rank state). Make
/// one with cohort::checkpoint_of (LibTorch state) or write your own files.
struct checkpoint_payload {
  std::function<void(std::filesystem::path const& dir, int rank)> write;
};

}  // namespace cohort
