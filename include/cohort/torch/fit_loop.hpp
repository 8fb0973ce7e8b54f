#pragma once
/// \file
/// cohort::fit_loop: the training loop most users would write, as a trainer functor (RaySGD's
/// TrainingOperator without inheritance). Give it a model factory, an optimizer factory, a loss
/// and fit_options; it prepares the model, shards and prefetches the training data, runs the
/// epochs (forward under autocast and loss scaling when asked, backward, clipping, step),
/// validates each epoch on every rank's slice of the validation set, all-reduces the metric sums
/// (so every metric is the whole job's, not rank 0's), reports once per epoch with a checkpoint,
/// and resumes from the latest one.
///
/// Parts replace a piece of it, each found by what it satisfies (no virtual functions):
/// an object with `train_step(state, batch)` (cohort::train_step_part) or `validate_step(state,
/// batch)` (cohort::validate_step_part), `cohort::on_epoch_end(f)` (a hook that may stop
/// training early), `cohort::lr_schedule(f)` (a learning-rate scheduler stepped every epoch), and
/// `cohort::train_data(d)` / `cohort::validation_data(d)` (a torch::data dataset or a
/// cohort::tensor_dataset held by the loop instead of the trainer's named datasets). The knobs,
/// the state a step sees and the parts are in torch/fit_parts.hpp.

#include <torch/torch.h>

#include <algorithm>
#include <any>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/comm/communicator.hpp"
#include "cohort/context.hpp"
#include "cohort/detail/callable.hpp"
#include "cohort/error.hpp"
#include "cohort/data/loader_options.hpp"
#include "cohort/torch/autocast.hpp"
#include "cohort/torch/checkpoint_state.hpp"
#include "cohort/data/torch/data_loader.hpp"
#include "cohort/torch/fit_parts.hpp"
#include "cohort/torch/grad_scaler.hpp"
#include "cohort/torch/prepare_model.hpp"

namespace cohort {

namespace detail {

/// Whether `P` is a fit_loop part tagged `Tag` (loop_part).
template <class P, class Tag>
struct is_part : std::false_type {};
template <class Tag, class T>
struct is_part<loop_part<Tag, T>, Tag> : std::true_type {};

/// The config type of a fit_loop: the second parameter the optimizer factory declares, else
/// the one the model factory declares, else nlohmann::json.
template <class Args, std::size_t N, bool = (std::tuple_size_v<Args> == N + 1)>
struct last_of {
  using type = void;
};
template <class Args, std::size_t N>
struct last_of<Args, N, true> {
  using type = std::remove_cvref_t<std::tuple_element_t<N, Args>>;
};
template <class F, std::size_t N, bool = call_signature<F>::known>
struct declared_config {
  using type = void;
};
template <class F, std::size_t N>
struct declared_config<F, N, true> : last_of<typename call_signature<F>::args, N> {};
template <class MakeModel, class MakeOptimizer>
using fit_config_t =
    std::conditional_t<!std::is_void_v<typename declared_config<MakeOptimizer, 1>::type>,
                       typename declared_config<MakeOptimizer, 1>::type,
                       std::conditional_t<!std::is_void_v<typename declared_config<MakeModel, 0>::type>,
                                          typename declared_config<MakeModel, 0>::type, nlohmann::json>>;

/// Calls `f(config)` when it takes the config, else `f()`.
template <class F, class Config>
decltype(auto) call_with_config(F& f, Config const& config) {
  if constexpr (std::is_invocable_v<F&, Config const&>) return f(config);
  else return f();
}

/// Calls `f(params, config)` when it takes the config, else `f(params)`.
template <class F, class Config>
decltype(auto) call_with_config(F& f, std::vector<torch::Tensor> params, Config const& config) {
  if constexpr (std::is_invocable_v<F&, std::vector<torch::Tensor>, Config const&>) return f(std::move(params), config);
  else return f(std::move(params));
}

/// Samples [lo, hi) of `source` in batches of `size`, to `f(batch&)`: a tensor_dataset by views,
/// anything else by gather().
template <class Source, class F>
void for_each_slice_batch(Source const& source, std::int64_t lo, std::int64_t hi, std::int64_t size, cohort::device dev,
                          F&& f) {
  for (auto b = lo; b < hi; b += size) {
    auto const len = std::min(size, hi - b);
    batch x;
    if constexpr (std::is_same_v<Source, tensor_dataset>) {
      x = {source.inputs.narrow(0, b, len), source.targets.narrow(0, b, len)};
    } else {
      std::vector<std::size_t> idx(static_cast<std::size_t>(len));
      for (std::int64_t k = 0; k < len; ++k) idx[static_cast<std::size_t>(k)] = static_cast<std::size_t>(b + k);
      x = gather(source, idx);
    }
    if (dev.kind == device_kind::cuda) {
      x.inputs = x.inputs.to(to_torch(dev), /*non_blocking=*/true);
      x.targets = x.targets.to(to_torch(dev), /*non_blocking=*/true);
    }
    f(x);
  }
}

/// The trainer's dataset `name`, or a cohort::error naming the datasets it has.
inline std::any const& find_dataset(context& ctx, std::string const& name, char const* knob) {
  auto const* ds = detail::context_access::dataset(ctx, name);
  if (!ds)
    throw cohort::error(std::string("fit_loop: fit_options.") + knob + " names no dataset '" + name + "': the trainer has " +
                        detail::context_access::dataset_names(ctx) + ": pass it with cohort::datasets{{\"" + name + "\", ...}}");
  return *ds;
}

/// The trainer's tensor_dataset `name` (validation reads slices of it), or a cohort::error.
inline tensor_dataset const& named_dataset(context& ctx, std::string const& name, char const* knob) {
  auto const* tensors = std::any_cast<tensor_dataset>(&find_dataset(ctx, name, knob));
  if (!tensors)
    throw cohort::error(std::string("fit_loop: dataset '") + name + "' is not a cohort::tensor_dataset (validation reads "
                        "each rank's slice of it by index, which a stream such as a shard dataset cannot give): pass "
                        "other datasets with cohort::validation_data(...), or load the validation set into memory");
  return *tensors;
}

}  // namespace detail

/// The default training loop as a trainer functor; see the file comment.
/// `cohort::fit_loop loop{[] { return net(); },
///                        [](std::vector<torch::Tensor> p, config const& c) { return torch::optim::SGD(p, c.lr); },
///                        torch::nn::CrossEntropyLoss(), cohort::fit_options{.batch_size = 64, .epochs = 4}};`
/// then `cohort::trainer{loop, cohort::datasets{{"train", train_set}}, ...}`.
///
/// `MakeModel`: `make()` or `make(config)` returns a LibTorch module (ModuleHolder or
/// shared_ptr). `MakeOptimizer`: `make(params)` or `make(params, config)` returns a
/// torch::optim optimizer over `params`. `Loss`: `loss(output, target)` returns the batch's mean
/// loss (a torch::nn loss module or any callable). `Options`: fit_options, or `f(config)`
/// returning them (so a tuner can search over batch size or epochs). The config type is the one
/// the optimizer factory (else the model factory) declares, else nlohmann::json.
/// Every epoch reports `epoch`, `train_loss`, `train_accuracy` and, with validation,
/// `val_loss` and `val_accuracy` (fit_options::validation_prefix; accuracy keys only with
/// fit_options::accuracy), and a
/// checkpoint (model, optimizer, loader position) every checkpoint_every_epochs.
template <class Config, class MakeModel, class MakeOptimizer, class Loss, class Options, class... Parts>
class fit_loop {
 public:
  using config_type = Config;
  using module_type = std::remove_cvref_t<decltype(detail::call_with_config(std::declval<MakeModel&>(), std::declval<Config const&>()))>;
  using model_type = prepared_model<module_type>;
  using optimizer_type = std::remove_cvref_t<decltype(detail::call_with_config(
      std::declval<MakeOptimizer&>(), std::declval<std::vector<torch::Tensor>>(), std::declval<Config const&>()))>;
  using state_type = fit_state<model_type, optimizer_type, Loss>;

 private:
  template <class P>
  static constexpr int part_kinds = int(train_step_part<P, state_type>) + int(validate_step_part<P, state_type>) +
                                    int(detail::is_part<P, epoch_end_tag>::value) +
                                    int(detail::is_part<P, lr_schedule_tag>::value) +
                                    int(detail::is_part<P, train_data_tag>::value) +
                                    int(detail::is_part<P, validation_data_tag>::value);
  static_assert(std::derived_from<optimizer_type, torch::optim::Optimizer>,
                "cohort::fit_loop: the optimizer factory must return a torch::optim optimizer (e.g. torch::optim::SGD)");
  static_assert(((part_kinds<Parts> >= 1) && ...),
                "cohort::fit_loop: this part is not one: give an object with train_step(state, batch) "
                "(cohort::train_step_part) or validate_step(state, batch) (cohort::validate_step_part) returning "
                "cohort::step_metrics, or cohort::on_epoch_end(f), cohort::lr_schedule(f), cohort::train_data(d) or "
                "cohort::validation_data(d)");

 public:
  fit_loop(MakeModel make_model, MakeOptimizer make_optimizer, Loss loss, Options options, Parts... parts)
      : make_model_(std::move(make_model)), make_optimizer_(std::move(make_optimizer)), loss_(std::move(loss)),
        options_(std::move(options)), parts_(std::move(parts)...) {}

  /// Trains on this rank; see the class comment. Collective, like any trainer functor.
  void operator()(context& ctx, Config const& config) {
    fit_options const options = options_for(config);
    if (options.epochs < 0 || options.checkpoint_every_epochs < 0 || options.validation_batch_size <= 0)
      throw cohort::error("fit_options: epochs and checkpoint_every_epochs must be >= 0 and validation_batch_size > 0");
    if (!(options.max_grad_norm >= 0))
      throw cohort::error("fit_options: max_grad_norm must be >= 0 (0: no clipping)");
    if (options.precision == mixed_precision::float16 && ctx.device().kind != device_kind::cuda)
      throw cohort::error("fit_options: precision float16 needs a CUDA device (scaling::cuda): on the CPU use "
                          "mixed_precision::bfloat16");
    std::optional<grad_scaler> scaler;
    if (auto const o = options.loss_scaling ? *options.loss_scaling : grad_scaler_options{};
        o.enabled && (options.loss_scaling || options.precision == mixed_precision::float16))
      scaler.emplace(o);
    auto model = ctx.prepare_model(detail::call_with_config(make_model_, config));
    optimizer_type optimizer = detail::call_with_config(make_optimizer_, model->parameters(), config);
    Loss loss = loss_;
    state_type state{ctx, model, optimizer, loss, options, 0, scaler ? &*scaler : nullptr};
    loader_options const lo{.batch_size = options.batch_size, .prefetch_batches = options.prefetch_batches,
                            .num_workers = options.num_workers};
    with_train_loader(ctx, lo, options, [&](auto& loader) { run(ctx, state, loader); });
  }

 private:
  fit_options options_for(Config const& config) const {
    if constexpr (std::is_invocable_r_v<fit_options, Options const&, Config const&>) return options_(config);
    else return options_;
  }

  template <class Tag>
  static constexpr bool has_part = (detail::is_part<Parts, Tag>::value || ...);

  /// What the first part tagged `Tag` holds.
  template <class Tag>
  auto& part() {
    return std::get<first_index<Tag>()>(parts_).value;
  }
  template <class Tag>
  static constexpr std::size_t first_index() {
    std::size_t i = 0;
    bool found = false;
    ((found = found || detail::is_part<Parts, Tag>::value, i += found ? 0 : 1), ...);
    return i;
  }
  template <class F>
  void with_train_loader(context& ctx, loader_options const& lo, fit_options const& options, F&& f) {
    if constexpr (has_part<train_data_tag>) {
      auto const& d = part<train_data_tag>();
      using D = std::remove_cvref_t<decltype(d)>;
      if constexpr (std::is_same_v<D, tensor_dataset>) {
        data_loader<tensor_dataset> loader(d, ctx.sharding(), lo, ctx.device(), ctx.sharding_seed());
        f(loader);
      } else if constexpr (requires { d.as_stream(); }) {  // a cohort::shard_dataset
        auto loader = stream_loader(ctx, d.as_stream(), lo);
        f(loader);
      } else {
        auto loader = prepare_data_loader(ctx, d, lo);
        f(loader);
      }
    } else {
      detail::find_dataset(ctx, options.train, "train");  // a clear error before any loader is made
      f(ctx.dataset_shard(options.train, lo));
    }
  }

  template <class Loader>
  void run(context& ctx, state_type& state, Loader& loader) {
    auto& options = state.options;
    if (auto const& ck = ctx.checkpoint()) {  // a rerun of the same run name resumes here
      loader_state position;
      load_checkpoint(*ck, state.model, state.optimizer, position);
      loader.restore(position);
      // The loss scale, saved after the position when scaling was on (absent: it starts afresh).
      if (auto const s = detail::checkpoint_value(*ck, 1); state.scaler && s.is_object()) state.scaler->load_state(s);
    }
    auto scheduler = make_scheduler(state.optimizer);
    for (std::int64_t e = 0; e < loader.state().epoch; ++e) step_scheduler(scheduler);  // where a resumed run was
    while (loader.state().epoch < options.epochs) {
      state.epoch = loader.state().epoch;
      state.model->train();
      step_metrics train;
      auto const skipped_before = loader.stats().skipped_samples;
      auto const skipped_steps_before = state.scaler ? state.scaler->skipped_steps() : 0;
      for (auto& b : loader.epoch()) add(train, train_step(state, b));
      nlohmann::json metrics{{"epoch", state.epoch}};
      put(ctx, metrics, "train", train, options.accuracy);
      if (state.scaler) {  // the same on every rank: the gradients it looks at are averaged
        metrics["loss_scale"] = state.scaler->current_scale();
        metrics["train_skipped_steps"] = state.scaler->skipped_steps() - skipped_steps_before;
      }
      // Bad samples a shard dataset left out (on_bad_sample = skip), the whole job's: reported when any.
      double skipped = static_cast<double>(loader.stats().skipped_samples - skipped_before);
      ctx.comm().allreduce(&skipped, 1, comm::reduce_op::sum);
      if (skipped > 0) metrics["train_skipped_samples"] = skipped;
      if (has_validation(options)) put(ctx, metrics, options.validation_prefix, validate(ctx, state), options.accuracy);
      bool const stop = end_of_epoch(ctx, metrics);
      step_scheduler(scheduler);
      auto const done = state.epoch + 1;
      if (options.checkpoint_every_epochs > 0 && (done % options.checkpoint_every_epochs == 0 || done == options.epochs || stop))
        ctx.report(metrics, state.scaler ? checkpoint_of(state.model, state.optimizer, loader.state(), state.scaler->state())
                                         : checkpoint_of(state.model, state.optimizer, loader.state()));
      else
        ctx.report(metrics);
      if (stop) return;
    }
  }

  static void add(step_metrics& into, step_metrics const& m) {
    into.loss_sum += m.loss_sum;
    into.correct += m.correct;
    into.samples += m.samples;
  }

  /// The job's totals of `m` (one all-reduce) as `<prefix>_loss` and `<prefix>_accuracy`.
  static void put(context& ctx, nlohmann::json& metrics, std::string const& prefix, step_metrics const& m, bool accuracy) {
    double sums[3] = {m.loss_sum, static_cast<double>(m.correct), static_cast<double>(m.samples)};
    ctx.comm().allreduce(sums, 3, comm::reduce_op::sum);
    double const n = std::max(sums[2], 1.0);
    metrics[prefix + "_loss"] = sums[0] / n;
    if (accuracy) metrics[prefix + "_accuracy"] = sums[1] / n;
  }

  step_metrics train_step(state_type& state, batch& b) {
    if constexpr ((train_step_part<Parts, state_type> || ...)) {
      return std::apply([&](auto&... p) { return first_train_step(state, b, p...); }, parts_);
    } else {
      state.optimizer.zero_grad();
      torch::Tensor output, loss;
      {
        std::optional<cohort::autocast> mixed;
        start_autocast(state, mixed);
        output = state.model->forward(b.inputs);
        loss = state.loss(output, b.targets);
      }
      auto* const scaler = state.scaler;
      (scaler ? scaler->scale(loss) : loss).backward();
      if (state.options.max_grad_norm > 0) {
        if (scaler) scaler->unscale(state.optimizer);  // clip the true gradients, not the scaled ones
        torch::nn::utils::clip_grad_norm_(state.model->parameters(), state.options.max_grad_norm);
      }
      if (scaler) {
        scaler->step(state.optimizer);  // skipped when a gradient is inf or NaN (on every rank alike)
        scaler->update();
      } else {
        state.optimizer.step();
      }
      return measured(state, output, loss, b);
    }
  }

  /// Opens fit_options::precision's autocast scope in `mixed` (none when off).
  static void start_autocast(state_type const& state, std::optional<cohort::autocast>& mixed) {
    if (state.options.precision != mixed_precision::off)
      mixed.emplace(state.ctx.device(), state.options.precision == mixed_precision::float16 ? at::kHalf : at::kBFloat16);
  }

  template <class P, class... Ps>
  static step_metrics first_train_step(state_type& state, batch& b, P& p, Ps&... ps) {
    if constexpr (train_step_part<P, state_type>) return p.train_step(state, b);
    else return first_train_step(state, b, ps...);
  }
  template <class P, class... Ps>
  static step_metrics first_validate_step(state_type& state, batch& b, P& p, Ps&... ps) {
    if constexpr (validate_step_part<P, state_type>) return p.validate_step(state, b);
    else return first_validate_step(state, b, ps...);
  }

  static step_metrics measured(state_type& state, torch::Tensor const& output, torch::Tensor const& loss, batch const& b) {
    step_metrics m;
    m.samples = b.inputs.size(0);
    m.loss_sum = loss.template item<double>() * static_cast<double>(m.samples);
    if (state.options.accuracy) m.correct = output.argmax(1).eq(b.targets).sum().template item<std::int64_t>();
    return m;
  }

  step_metrics validate_step(state_type& state, batch& b) {
    if constexpr ((validate_step_part<Parts, state_type> || ...)) {
      return std::apply([&](auto&... p) { return first_validate_step(state, b, p...); }, parts_);
    } else {
      std::optional<cohort::autocast> mixed;
      start_autocast(state, mixed);
      auto output = state.model->forward(b.inputs);
      auto loss = state.loss(output, b.targets);
      return measured(state, output, loss, b);
    }
  }

  bool has_validation(fit_options const& options) const {
    return has_part<validation_data_tag> || !options.validation.empty();
  }

  /// This rank's contiguous slice of the validation set, scored in eval mode without gradients.
  step_metrics validate(context& ctx, state_type& state) {
    state.model->eval();
    torch::NoGradGuard no_grad;
    step_metrics total;
    auto over = [&](auto const& source) {
      auto const n = static_cast<std::int64_t>(source.size());
      auto const per = (n + ctx.world_size() - 1) / ctx.world_size();
      auto const lo = std::min<std::int64_t>(n, per * ctx.world_rank());
      auto const hi = std::min<std::int64_t>(n, lo + per);
      detail::for_each_slice_batch(source, lo, hi, state.options.validation_batch_size, ctx.device(),
                                   [&](batch& b) { add(total, validate_step(state, b)); });
    };
    if constexpr (has_part<validation_data_tag>) {
      auto const& d = part<validation_data_tag>();
      using D = std::remove_cvref_t<decltype(d)>;
      if constexpr (std::is_same_v<D, tensor_dataset>) over(d);
      else over(torch_data_source<D>{std::make_shared<D>(d)});
    } else {
      over(detail::named_dataset(ctx, state.options.validation, "validation"));
    }
    return total;
  }

  /// The epoch-end hooks, in order; true when any asks to stop (agreed over the ranks).
  bool end_of_epoch(context& ctx, nlohmann::json& metrics) {
    std::int32_t stop = 0;
    std::apply([&](auto&... p) { (call_hook(ctx, metrics, p, stop), ...); }, parts_);
    ctx.comm().allreduce(&stop, 1, comm::reduce_op::max);  // a hook that differs on one rank stops every rank
    return stop != 0;
  }
  template <class P>
  static void call_hook(context& ctx, nlohmann::json& metrics, P& p, std::int32_t& stop) {
    if constexpr (detail::is_part<P, epoch_end_tag>::value) {
      if constexpr (std::is_void_v<std::invoke_result_t<decltype(p.value)&, context&, nlohmann::json&>>) p.value(ctx, metrics);
      else if (p.value(ctx, metrics)) stop = 1;
    }
  }

  auto make_scheduler(optimizer_type& optimizer) {
    if constexpr (has_part<lr_schedule_tag>) {
      return std::make_optional(part<lr_schedule_tag>()(static_cast<torch::optim::Optimizer&>(optimizer)));
    } else {
      return 0;
    }
  }
  template <class S>
  static void step_scheduler(S& s) {
    if constexpr (!std::is_same_v<S, int>) s->step();
  }

  MakeModel make_model_;
  MakeOptimizer make_optimizer_;
  Loss loss_;
  Options options_;
  std::tuple<Parts...> parts_;
};

template <class MakeModel, class MakeOptimizer, class Loss, class Options, class... Parts>
fit_loop(MakeModel, MakeOptimizer, Loss, Options, Parts...)
    -> fit_loop<detail::fit_config_t<MakeModel, MakeOptimizer>, MakeModel, MakeOptimizer, Loss, Options, Parts...>;

}  // namespace cohort
