#pragma once
/// \file
/// checkpointing::staging: where one attempt of a run stages a checkpoint before rank 0 commits
/// it (checkpointing/checkpoint.hpp's commit): `<run>/.staging/<prefix>checkpoint_NNNNNN`, into
/// which every rank's payload writes its files, and from which a payload that is not committed is
/// undone.

#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"

namespace cohort::checkpointing {

/// One rank's view of a run's staging directories.
struct staging {
  std::filesystem::path run_path;
  std::string prefix;  ///< unique per attempt, the same on every rank: staging directories never collide
  int rank = 0;

  /// The staging directory of checkpoint `iteration`.
  std::filesystem::path of(std::int64_t iteration) const { return run_path / ".staging" / (prefix + dir_name(iteration)); }

  /// This rank's files of checkpoint `iteration` into its staging directory; a cohort::error
  /// naming the checkpoint and the cause when the directory cannot be made or `payload` throws.
  void write(std::int64_t iteration, checkpoint_payload const& payload) const {
    try {
      std::error_code ec;
      std::filesystem::create_directories(of(iteration), ec);
      if (ec)
        throw cohort::error("cannot create " + of(iteration).string() + " (" + ec.message() +
                            "): check free space and that run_config.storage_path is writable");
      if (payload.write) payload.write(of(iteration), rank);
    } catch (std::exception const& e) {
      throw cohort::error(std::string("writing checkpoint ") + dir_name(iteration) + " failed: " + e.what());
    }
  }

  /// A checkpoint that will not be committed: the payload's undo (a moved directory moved back).
  /// Best effort: the error being reported is the write's or the commit's.
  void undo(std::int64_t iteration, checkpoint_payload const& payload) const noexcept {
    if (!payload.undo) return;
    try {
      payload.undo(of(iteration), rank);
    } catch (...) {
    }
  }
};

}  // namespace cohort::checkpointing
