#pragma once
/// \file
/// Validation on ranks of its own (run_config::validators, Ray's validate_fn run on other
/// workers): the last ranks of fit()'s communicator do not train; they validate each committed
/// checkpoint together while the others go on training. Rank 0 of the trainers asks (from
/// checkpointing::retained's validation thread) over a two-rank link to the first validator,
/// which hands the checkpoint to every validator; they run the user's validator_fn (which may
/// communicate among them), agree that none failed, and the first validator's metrics go back,
/// merged into the checkpoint's metrics as a validate_fn's are. At the end of fit() rank 0
/// sends the run's result, which the validators return. This header holds the knobs, what a
/// validator sees, and that protocol; trainer.hpp composes them.

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/error.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"

namespace cohort {

/// What a validator_fn sees: its place among the validators, its device and their communicator.
/// Valid for the duration of fit(); not copyable.
class validator_context {
 public:
  /// Built by the trainer.
  validator_context(scaling::topology topo, cohort::device dev, comm::any& comm)
      : topo_(topo), device_(dev), comm_(comm) {}
  validator_context(validator_context const&) = delete;
  validator_context& operator=(validator_context const&) = delete;

  int world_rank() const { return topo_.world_rank; }  ///< rank among the validators
  int world_size() const { return topo_.world_size; }  ///< validators
  /// Node and local ranks among the validators, and the rank's place among the job's ranks on
  /// its node (what scaling::cuda picks the GPU by: validators and trainers get different GPUs).
  scaling::topology const& topology() const { return topo_; }
  cohort::device device() const { return device_; }  ///< this validator's device
  /// The validators' communicator, for a validation split over them (each scores a slice, then
  /// one all-reduce). Every validator runs the validator_fn on every checkpoint, so collectives
  /// inside it are entered by all of them; it has the run's collective deadline.
  comm::any& comm() { return comm_; }

 private:
  scaling::topology topo_;
  cohort::device device_;
  comm::any& comm_;
};

/// Validates a committed checkpoint on every validator: returns metrics (a JSON object); the
/// first validator's are merged into the checkpoint's metrics.
using validator_fn = std::function<nlohmann::json(cohort::checkpoint const&, validator_context&)>;

/// run_config::validators: ranks that validate instead of training.
struct validator_options {
  /// The last `ranks` ranks of fit()'s communicator validate every committed checkpoint; the
  /// others train (the functor's context counts them only). 0: no validator ranks.
  int ranks = 0;
  /// What each validator runs on each committed checkpoint (required when ranks > 0).
  validator_fn validate{};
};

namespace checkpointing {

/// Pure: what is wrong with `options` for a communicator of `comm_size` ranks in a process whose
/// MPI provides `mpi_thread_level` (rank 0 asks the validators from a thread of its own), as a
/// one-line error naming the fix, or nothing.
inline std::optional<std::string> validator_problem(validator_options const& options, int comm_size,
                                                    int mpi_thread_level = MPI_THREAD_MULTIPLE) {
  if (options.ranks == 0) return std::nullopt;
  if (mpi_thread_level < MPI_THREAD_MULTIPLE)
    return "run_config.validators needs MPI initialised with MPI_THREAD_MULTIPLE: let cohort::environment initialise MPI";
  if (options.ranks < 0 || options.ranks >= comm_size)
    return "run_config.validators.ranks = " + std::to_string(options.ranks) + " with " + std::to_string(comm_size) +
           " ranks: give between 0 and " + std::to_string(comm_size - 1) + " (at least one rank must train), or start more ranks";
  if (!options.validate) return "run_config.validators.ranks = " + std::to_string(options.ranks) + " without a validate function: set run_config.validators.validate";
  return std::nullopt;
}

/// Rank 0 of the trainers, on its validation thread: has the validators validate checkpoint
/// `dir` and returns the first validator's metrics. Throws cohort::error with the validators'
/// agreed error when a validator failed. `link`: rank 0 the trainer, rank 1 the first validator.
inline nlohmann::json ask_validators(comm::any& link, std::filesystem::path const& dir) {
  nlohmann::json const ask{{"what", "validate"}, {"path", std::filesystem::absolute(dir).string()}};
  comm::broadcast_string(link, ask.dump(), 0);
  auto const reply = nlohmann::json::parse(comm::broadcast_string(link, std::string{}, 1));
  if (reply.contains("error")) throw cohort::error(reply["error"].get<std::string>());
  return reply["metrics"];
}

/// Rank 0 of the trainers, after fit(): ends the validators' loop; they return `result` (the
/// run's result as JSON).
inline void end_validators(comm::any& link, nlohmann::json const& result) {
  comm::broadcast_string(link, nlohmann::json{{"what", "end"}, {"result", result}}.dump(), 0);
}

/// The validators' loop: for each checkpoint rank 0 of the trainers commits, every validator
/// runs `validate`; then they agree on failures (a validator whose validate threw waits at
/// most `abort_timeout_ms` for the others, which may be in a collective it left, then aborts
/// the job), and the first validator answers over `link` (set on it only). `wait`: the
/// validators' communicator without a deadline (checkpoints come when training makes them);
/// `ctx.comm()` has the run's. Returns the run's result that ends the loop.
inline nlohmann::json serve_validations(comm::any* link, comm::any& wait, validator_fn const& validate,
                                        validator_context& ctx, int abort_timeout_ms) {
  for (;;) {
    std::string ask = link ? comm::broadcast_string(*link, std::string{}, 0) : std::string{};
    auto const message = nlohmann::json::parse(comm::broadcast_string(wait, std::move(ask), 0));
    if (message.value("what", std::string{}) == "end") return message["result"];
    auto const path = message["path"].get<std::string>();
    nlohmann::json metrics;
    std::optional<std::string> failure;
    try {
      metrics = validate(cohort::checkpoint::from_directory(path), ctx);
      if (!metrics.is_object()) failure = "the validator function must return a JSON object, got " + metrics.dump();
    } catch (std::exception const& e) {
      failure = e.what();
    }
    std::int32_t failed = failure ? 1 : 0;
    auto agreed = wait.iallreduce(&failed, 1, comm::reduce_op::max);
    if (failure) {
      comm::detail::wait_or_abort([&] { return agreed.test(); }, abort_timeout_ms, comm::detail::world_rank(),
                                  "validating " + path + ": " + *failure);
    } else {
      agreed.wait();
    }
    if (failed) failure = comm::agree_on_error(wait, failure);
    if (!link) continue;
    auto const reply = failure ? nlohmann::json{{"error", "a validator failed: " + *failure}}
                               : nlohmann::json{{"metrics", std::move(metrics)}};
    comm::broadcast_string(*link, reply.dump(), 1);
  }
}

}  // namespace checkpointing

}  // namespace cohort
