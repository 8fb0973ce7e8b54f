#pragma once
/// \file
/// What cohort::fit_loop is made of: its knobs (fit_options, mixed_precision), what a step adds
/// (step_metrics) and sees (fit_state), and the parts that replace a piece of it: the concepts
/// train_step_part, validate_step_part, epoch_end_hook and lr_scheduler_factory, and
/// on_epoch_end, lr_schedule, train_data and validation_data.

#include <torch/torch.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/context.hpp"
#include "cohort/data/torch/data_loader.hpp"
#include "cohort/torch/grad_scaler.hpp"

namespace cohort {

/// The precision of fit_loop's forward pass and loss (fit_options::precision). Parameters,
/// gradients and the optimizer stay float32 in every mode (Python's torch.autocast).
enum class mixed_precision {
  off,       ///< float32 throughout
  bfloat16,  ///< forward and loss under cohort::autocast in bfloat16, on the CPU or CUDA
  float16,   ///< forward and loss under autocast in float16 (CUDA only), with loss scaling (cohort::grad_scaler)
};

/// The knobs of cohort::fit_loop.
struct fit_options {
  std::int64_t batch_size = 32;               ///< training samples per batch on each rank
  std::int64_t epochs = 1;                    ///< epochs in all (a resumed run trains the rest)
  std::size_t prefetch_batches = 2;           ///< batches made ahead by a background thread (0: none; see loader_options)
  std::size_t num_workers = 0;                ///< threads making (decoding) training batches in parallel (loader_options)
  std::string train = "train";                ///< the trainer's dataset to train on (cohort::datasets)
  std::string validation{};                   ///< the trainer's dataset to validate on (empty: no validation)
  std::string validation_prefix = "val";      ///< validation metrics are <prefix>_loss and <prefix>_accuracy
  std::int64_t validation_batch_size = 128;   ///< samples per validation batch
  mixed_precision precision = mixed_precision::off;  ///< forward and loss under cohort::autocast in this precision
  /// Dynamic loss scaling (cohort::grad_scaler: scale the loss, unscale before clipping, skip a
  /// step whose gradients are inf or NaN, scale kept in the checkpoint). Empty: on with float16
  /// with GradScaler's defaults, off otherwise; given: on with these knobs (`.enabled = false`: off).
  std::optional<grad_scaler_options> loss_scaling{};
  double max_grad_norm = 0;                   ///< clip the gradients' total 2-norm to this before each step (0: no clipping)
  bool accuracy = true;                       ///< also report accuracy: argmax of the output vs the target
  std::int64_t checkpoint_every_epochs = 1;   ///< a checkpoint with every n-th epoch's report (0: none)
};

/// What a step adds to its epoch's metrics, summed over the batch's samples.
struct step_metrics {
  double loss_sum = 0;       ///< the loss summed over the samples (the mean loss times `samples`)
  std::int64_t correct = 0;  ///< samples whose argmax output is the target (with fit_options::accuracy)
  std::int64_t samples = 0;  ///< samples in the batch
};

/// What a step sees of the loop: the context, the prepared model, the optimizer, the loss and the
/// options, the epoch being run, and the loss scaler (null without loss scaling).
template <class Model, class Optimizer, class Loss>
struct fit_state {
  context& ctx;
  Model& model;
  Optimizer& optimizer;
  Loss& loss;
  fit_options const& options;
  std::int64_t epoch = 0;
  grad_scaler* scaler = nullptr;  ///< fit_options::loss_scaling's; a train_step part scales with it too
};

/// A part that replaces the training step: `train_step(state, batch)` runs forward, backward and
/// the optimizer step on one batch and returns its step_metrics.
template <class P, class State>
concept train_step_part = requires(P& p, State& s, batch& b) {
  { p.train_step(s, b) } -> std::convertible_to<step_metrics>;
};

/// A part that replaces the validation step: `validate_step(state, batch)` scores one batch
/// (the model is in eval mode, gradients off) and returns its step_metrics.
template <class P, class State>
concept validate_step_part = requires(P& p, State& s, batch& b) {
  { p.validate_step(s, b) } -> std::convertible_to<step_metrics>;
};

/// A hook called after every epoch on every rank with the epoch's metrics (the whole job's,
/// the same on every rank), before they are reported: it may add metrics, and returns void or a
/// bool, true to stop training after this epoch (early stopping).
template <class F>
concept epoch_end_hook = std::invocable<F&, context&, nlohmann::json&> &&
                         (std::is_void_v<std::invoke_result_t<F&, context&, nlohmann::json&>> ||
                          std::same_as<std::invoke_result_t<F&, context&, nlohmann::json&>, bool>);

/// What the part functions below make: the function or dataset given (`value`), under a tag
/// naming the part; fit_loop finds each part by its tag.
template <class Tag, class T>
struct loop_part {
  T value;
};
struct epoch_end_tag {};        ///< cohort::on_epoch_end(f)'s part: f
struct lr_schedule_tag {};      ///< cohort::lr_schedule(f)'s part: f
struct train_data_tag {};       ///< cohort::train_data(d)'s part: d
struct validation_data_tag {};  ///< cohort::validation_data(d)'s part: d

/// A fit_loop part: `f(ctx, metrics)` after every epoch (see cohort::epoch_end_hook).
template <epoch_end_hook F>
loop_part<epoch_end_tag, F> on_epoch_end(F f) {
  return {std::move(f)};
}

/// A learning-rate scheduler factory: `f(optimizer)` returns an object with `step()`, stepped
/// once after every epoch, as a hand-written LibTorch loop would (LibTorch's torch::optim::StepLR,
/// or any such type). LibTorch's StepLR leaves its first step() a no-op, where PyTorch's takes
/// that step in its constructor: StepLR(o, 1, 0.5) halves the rate from the third epoch on.
template <class F>
concept lr_scheduler_factory = std::invocable<F&, torch::optim::Optimizer&> &&
                               requires(std::invoke_result_t<F&, torch::optim::Optimizer&>& s) { s.step(); };

/// A fit_loop part: the learning rate scheduled by `f(optimizer)` (see cohort::lr_scheduler_factory).
template <lr_scheduler_factory F>
loop_part<lr_schedule_tag, F> lr_schedule(F f) {
  return {std::move(f)};
}

/// A fit_loop part: train on `d` (a torch::data dataset or a cohort::tensor_dataset, sharded by
/// the trainer's policy, or a cohort::shard_dataset, dealt by its own) instead of the trainer's
/// dataset fit_options::train.
template <class D>
loop_part<train_data_tag, D> train_data(D d) {
  return {std::move(d)};
}
/// A fit_loop part: validate on `d` (a torch::data dataset or a cohort::tensor_dataset) instead
/// of the trainer's dataset fit_options::validation.
template <class D>
loop_part<validation_data_tag, D> validation_data(D d) {
  return {std::move(d)};
}

}  // namespace cohort
