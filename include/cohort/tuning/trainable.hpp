#pragma once
/// \file
/// Ray's class API for trials: an object with setup/step/save_checkpoint/load_checkpoint (and
/// optionally reset_config), turned into an ordinary trainer functor that reports each step.

#include <concepts>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/payload.hpp"
#include "cohort/context.hpp"

namespace cohort {

/// A class trainable (Ray's `tune.Trainable`): copied from the prototype given to the tuner for
/// each trial, then `setup(config)`; `step()` returns one result (a JSON object; `"done": true`
/// ends the trial); `save_checkpoint(dir)` writes its state into `dir` (rank 0 of the trial
/// only), `load_checkpoint(dir)` reads it back on every rank.
template <class T>
concept trainable_class = std::copy_constructible<T> &&
    requires(T& t, nlohmann::json const& config, std::filesystem::path const& dir) {
      t.setup(config);
      { t.step() } -> std::convertible_to<nlohmann::json>;
      t.save_checkpoint(dir);
      t.load_checkpoint(dir);
    };

/// A class trainable that can take a new config in place (Ray's `reset_config` with reuse_actors):
/// the next trial on the same ranks (a new trial, or PBT's exploit restarting one) reuses the
/// object through reset_config instead of copying the prototype and calling setup again. Returns
/// false when it cannot, and a fresh object is set up.
template <class T>
concept resettable_trainable = trainable_class<T> && requires(T& t, nlohmann::json const& config) {
  { t.reset_config(config) } -> std::convertible_to<bool>;
};

/// The trainer functor that runs a class trainable: setup, restore from the trial's checkpoint if
/// there is one, then step and report until a result says "done" or the tuner stops the trial,
/// with a checkpoint every `checkpoint_frequency` steps. Resumed from a checkpoint whose result
/// said "done", it returns at once.
template <trainable_class T>
struct trainable_functor {
  T prototype;
  std::size_t checkpoint_frequency = 1;
  /// The object of the last trial on this rank, reused through reset_config when T has one.
  std::shared_ptr<std::optional<T>> last = std::make_shared<std::optional<T>>();

  void operator()(context& ctx, nlohmann::json const& config) const {
    T& t = object_for(config);
    if (auto const& c = ctx.checkpoint()) {
      // A trial whose last checkpointed result said "done" has finished; it was interrupted
      // before the tuner heard so.
      if (c->metadata().value("metrics", nlohmann::json::object()).value("done", false)) return;
      t.load_checkpoint(c->path());
    }
    for (std::size_t step = 1;; ++step) {
      nlohmann::json result = t.step();
      bool const done = result.is_object() && result.value("done", false);
      if (checkpoint_frequency > 0 && (step % checkpoint_frequency == 0 || done)) {
        ctx.report(result, checkpoint_payload{.write = [&t](std::filesystem::path const& dir, int rank) {
                     if (rank == 0) t.save_checkpoint(dir);
                   }});
      } else {
        ctx.report(result);
      }
      if (done) return;
    }
  }

 private:
  T& object_for(nlohmann::json const& config) const {
    if constexpr (resettable_trainable<T>) {
      if (last->has_value() && static_cast<bool>((*last)->reset_config(config))) return **last;
    }
    last->emplace(prototype);
    (*last)->setup(config);
    return **last;
  }
};

}  // namespace cohort
