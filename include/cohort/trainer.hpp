#pragma once
/// \file
/// cohort::trainer: a user's training functor composed with scaling, sharding and checkpointing
/// policies into a data-parallel run over a communicator. Its parts, in detail/trainer/:
/// policy_pack.hpp (the policy arguments), setup.hpp (setup, agreed on every rank) and
/// completion.hpp (the end of a run).

#include <mpi.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/validators.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/concepts.hpp"
#include "cohort/context.hpp"
#include "cohort/detail/callable.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/detail/trainer/policy_pack.hpp"
#include "cohort/detail/trainer/completion.hpp"
#include "cohort/detail/trainer/setup.hpp"
#include "cohort/environment.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/report/protocol.hpp"
#include "cohort/result.hpp"
#include "cohort/run_config.hpp"

namespace cohort {

/// A data-parallel trainer: `fn` run on every rank of a communicator, composed with up to one
/// policy per axis, in any order: scaling (default scaling::cpu{}), sharding (default
/// sharding::contiguous{}), checkpointing (default cohort::checkpointing::keep_all{}); and optionally the
/// named cohort::datasets that `ctx.dataset_shard(name)` reads.
///
/// `fn` is `fn(cohort::context&, Config const&)` or `fn(cohort::context&)`; it may return a
/// value (gathered from every rank into result::return_values; it must convert to JSON).
template <class Fn, class... Policies>
class trainer {
  static_assert((detail::trainer::check_policy<Policies>::value && ...));
  static_assert(detail::trainer::count_matching<detail::trainer::is_scaling, Policies...> <= 1 &&
                    detail::trainer::count_matching<detail::trainer::is_sharding, Policies...> <= 1 &&
                    detail::trainer::count_matching<detail::trainer::is_checkpointing, Policies...> <= 1,
                "cohort::trainer: two policies given for the same axis (scaling, sharding or checkpointing)");

 public:
  using scaling_type = typename detail::trainer::policy_or<detail::trainer::is_scaling, scaling::cpu, Policies...>::type;
  using sharding_type = typename detail::trainer::policy_or<detail::trainer::is_sharding, sharding::contiguous, Policies...>::type;
  using checkpointing_type =
      typename detail::trainer::policy_or<detail::trainer::is_checkpointing, cohort::checkpointing::keep_all, Policies...>::type;

  explicit trainer(Fn fn, Policies... policies) : fn_(std::move(fn)), policies_(std::move(policies)...) {}

  scaling_type const& scaling() const { return detail::trainer::get_or(policies_, default_scaling_); }
  sharding_type const& sharding() const { return detail::trainer::get_or(policies_, default_sharding_); }
  checkpointing_type const& checkpointing() const { return detail::trainer::get_or(policies_, default_checkpointing_); }

  /// Runs the functor with an empty JSON config on every rank of MPI_COMM_WORLD.
  auto fit() { return fit(nlohmann::json::object()); }

  /// Runs the functor on every rank of MPI_COMM_WORLD (MPI is initialised if no
  /// cohort::environment did it). See the communicator overload.
  template <class Config>
  auto fit(Config const& config, run_config const& run = {}) {
    detail::ensure_mpi_for_program();
    auto world = comm::mpi::world();
    return fit(config, run, world);
  }

  /// Runs the functor on every rank of `comm`; every rank of `comm` must call fit() with it.
  /// Rank 0's `config` is used on every rank (converted to JSON, broadcast, converted to the
  /// functor's config type) and written to params.json. Bad input (worker count, config, storage
  /// path) is reported on every rank in result::error; an exception thrown by the functor on
  /// any rank fails the run on every rank, or aborts the job after run.abort_timeout_ms when the
  /// other ranks are stuck in a collective the failed rank will not enter. Never hangs.
  template <class Config, comm::communicator C>
  auto fit(Config const& config, run_config const& run, C& comm) {
    return fit(config, run, comm, report::listener{});
  }

  /// As above, with `listener` consulted after every report (rank 0 calls it, every rank learns
  /// its answer): how cohort::tuner runs a trial and stops it early.
  template <class Config, comm::communicator C>
  auto fit(Config const& config, run_config const& run, C& comm, report::listener listener) {
    if (run.validators.ranks == 0) return fit_ranks(config, run, comm, std::move(listener), validate_fn{});
    return fit_with_validators(config, run, comm, std::move(listener));
  }

  /// As above, without validators, on communicators the caller split (detail::trainer::run_comms) and may
  /// use again for the next run when this one ended without an error: cohort::tuner keeps a trial
  /// group's between trials (splitting three per trial was a quarter of a one-report trial's
  /// cost, bench_tune trials/N).
  template <class Config>
  auto fit(Config const& config, run_config const& run, detail::trainer::run_comms& comms, report::listener listener) {
    return fit_on(config, run, comms, std::move(listener), validate_fn{});
  }

 private:
  /// The functor's return type for a `Config`.
  template <class Config, class Param = detail::config_param_t<Fn, Config>>
  using return_of = typename std::conditional_t<std::is_invocable_v<Fn&, context&, Param const&>,
                                                std::invoke_result<Fn&, context&, Param const&>,
                                                std::invoke_result<Fn&, context&>>::type;

  /// run_config::validators: the communicator's last ranks validate while the first ones train
  /// (checkpointing/validators.hpp). Every rank returns the trainers' result.
  template <class Config, comm::communicator C>
  result<return_of<Config>> fit_with_validators(Config const& config, run_config const& run, C& comm,
                                                report::listener listener) {
    result<return_of<Config>> out;
    int const timeout_ms = detail::trainer::deadline_ms(run);
    comm::any all(comm.split(0, comm.rank()));
    detail::trainer::set_comm_options(all, {.timeout_ms = timeout_ms, .name = "validators' setup"});
    int const rank = all.rank();
    int thread_level = 0;
    MPI_Query_thread(&thread_level);
    if (auto e = comm::agree_on_error(all, cohort::checkpointing::validator_problem(run.validators, all.size(), thread_level)))
      return detail::trainer::fail_run(std::move(out), *e, rank);
    int const first_validator = all.size() - run.validators.ranks;
    bool const validating = rank >= first_validator;
    comm::any group = all.split(validating ? 1 : 0, rank);
    comm::any link = all.split(rank == 0 || rank == first_validator ? 1 : 0, rank);  // trainer 0, validator 0
    detail::trainer::set_comm_options(link, {.timeout_ms = 0, .name = "validation link"});  // checkpoints come when they come
    if (!validating) {
      auto training = run;
      training.validators = {};
      validate_fn ask;
      if (rank == 0) ask = [&link](cohort::checkpoint const& c) { return cohort::checkpointing::ask_validators(link, c.path()); };
      out = fit_ranks(config, training, group, std::move(listener), std::move(ask));
      if (rank == 0) cohort::checkpointing::end_validators(link, detail::result_to_json(out));
      return out;
    }
    detail::trainer::set_comm_options(group, {.timeout_ms = 0, .name = "validators"});
    comm::any work = group.split(0, group.rank());
    detail::trainer::set_comm_options(work, {.timeout_ms = timeout_ms, .name = "validation"});
    auto const placed = detail::trainer::locate(scaling(), work);
    validator_context ctx(placed.topo, scaling().device_for(placed.topo), work);
    detail::trainer::signal_guard signals;  // SIGTERM/SIGINT stop the trainers at their next report, then these
    auto ended = detail::result_from_json<return_of<Config>>(cohort::checkpointing::serve_validations(
        group.rank() == 0 ? &link : nullptr, group, run.validators.validate, ctx, run.abort_timeout_ms));
    if (!ended.error) return ended;
    auto const message = *ended.error;
    return detail::trainer::fail_run(std::move(ended), message, rank);
  }

  /// fit() on the ranks that train; `validate_every` (rank 0) validates every committed checkpoint.
  template <class Config, comm::communicator C>
  auto fit_ranks(Config const& config, run_config const& run, C& comm, report::listener listener,
                 validate_fn validate_every) {
    detail::trainer::run_comms comms(comm, run);
    return fit_on(config, run, comms, std::move(listener), std::move(validate_every));
  }

  /// fit_ranks() on communicators already split.
  template <class Config>
  auto fit_on(Config const& config, run_config const& run, detail::trainer::run_comms& comms, report::listener listener,
              validate_fn validate_every) {
    using param_type = detail::config_param_t<Fn, Config>;
    constexpr bool takes_config = std::is_invocable_v<Fn&, context&, param_type const&>;
    static_assert(takes_config || std::is_invocable_v<Fn&, context&>,
                  "cohort::trainer: the functor must be callable as fn(cohort::context&, Config const&) "
                  "or fn(cohort::context&)");
    using return_type = return_of<Config>;
    result<return_type> out;

    int const timeout_ms = detail::trainer::deadline_ms(run);  // 0: no deadline
    int const rank = comms.control.rank();
    auto setup = detail::trainer::agree_on_config<param_type>(scaling(), config, run, comms.control);
    auto const run_path = std::filesystem::path(run.storage_path) / setup.name;
    out.path = run_path;
    detail::lockstep steps(comm::any::ref(comms.check));
    // The run's callbacks, on rank 0, outside a tuner (whose callbacks see every trial).
    std::unique_ptr<report::callback_runner> callbacks;
    if (rank == 0 && !listener && !setup.error) callbacks = report::make_callback_runner(
          std::apply([](auto const&... p) { return detail::trainer::those_matching<detail::trainer::is_callback>(p...); }, policies_));
    report::experiment_info const info{.name = setup.name, .path = run_path, .world_size = comms.control.size()};
    report::protocol reports(comms.control, steps,
                             {.rank = rank,
                              .run_path = run_path,
                              .mode = run.checkpoint_mode,
                              .listener = std::move(listener),
                              .callbacks = callbacks.get(),
                              .retain = [policy = checkpointing()](std::span<cohort::checkpointing::record const> all) {
                                return policy.retain(all);
                              },
                              .validate_every = std::move(validate_every)});
    auto opened = detail::trainer::open_run(run, run_path, setup, reports, steps, comms.control);
    if (opened.error) return detail::trainer::fail_run(std::move(out), *opened.error, rank);
    if (callbacks) {
      callbacks->experiment_start(info);
      callbacks->trial_start({.id = setup.name, .config = nlohmann::json::parse(setup.text), .path = run_path},
                             opened.resume.value("path", std::string{}));
    }
    auto tell_end = [&](std::optional<std::string> const& error) {
      if (!callbacks) return;
      if (error) callbacks->trial_error(setup.name, *error);
      else callbacks->trial_complete(setup.name);
      callbacks->finish(&info);
    };
    auto placed = detail::trainer::place(scaling(), comms.control, run_path);
    if (placed.error) return detail::trainer::fail_run(std::move(out), *placed.error, rank);

    auto shard = [policy = sharding()](std::size_t n, int w, int r, std::int64_t e) { return policy.indices(n, w, r, e); };
    std::uint64_t seed = 0;
    if constexpr (requires(sharding_type const& p) { p.seed; }) seed = static_cast<std::uint64_t>(sharding().seed);
    static cohort::datasets const no_datasets{};
    context ctx(placed.topo, scaling().device_for(placed.topo), placed.threads, setup.name, run_path, comms.work, reports,
                shard, &detail::trainer::get_or(policies_, no_datasets), seed);
    if (opened.resume.contains("path"))
      detail::context_access::set_resume_checkpoint(ctx, cohort::checkpoint::from_directory(opened.resume["path"].template get<std::string>()));
    detail::context_access::set_collective_timeout_ms(ctx, timeout_ms);
    detail::trainer::position_guard where([&steps] { return steps.where(); });  // named in deadline messages
    detail::trainer::signal_guard signals;  // SIGTERM/SIGINT: stop at the next report, on every rank

    auto ran = call<return_type>(ctx, *setup.param, steps, reports);
    out.stopped = ran.stopped;
    if (ran.failure && !ran.preempted && !steps.broken()) detail::trainer::tell_the_others(steps, *ran.failure, run.abort_timeout_ms, rank);
    if (auto e = detail::trainer::complete(comms.control, reports, ran, run.abort_timeout_ms)) {
      out.preempted = ran.preempted;
      tell_end(e);
      return detail::trainer::fail_run(std::move(out), *e, rank);
    }
    tell_end(std::nullopt);
    detail::trainer::collect_results(out, comms.control, reports, ran, checkpointing());
    return out;
  }

  /// The functor. Any exception is held until every rank has finished; the other ranks learn of
  /// it at their next agreement (lockstep), or the job is aborted after abort_timeout_ms.
  template <class Return, class Param>
  detail::trainer::outcome<Return> call(context& ctx, Param const& param, detail::lockstep& steps, report::protocol& reports) {
    detail::trainer::outcome<Return> out;
    try {
      if constexpr (std::is_void_v<Return>) {
        invoke_fn(ctx, param);
        out.value.emplace();
      } else {
        out.value.emplace(invoke_fn(ctx, param));
        if (reports.under_tuner()) report_returned(ctx, *out.value);
      }
      steps.agree(detail::step::end);  // every rank returned, from the same place
      reports.flush();                 // async checkpoints still in flight
    } catch (report::stopped_by_tuner const& s) {
      out.stopped = s.reason;
    } catch (report::preempted const& p) {
      out.preempted = true;
      out.failure = std::string("stopped by ") + (p.signal == SIGINT ? "SIGINT" : "SIGTERM") + " after report " +
                    std::to_string(p.iteration) + " (its checkpoint, if any, is committed): rerun the same command to resume";
    } catch (detail::diverged const& d) {
      out.failure = d.what();
      out.secondary = d.peer_failed();
    } catch (std::exception const& e) {
      out.failure = e.what();
    } catch (...) {
      out.failure = "unknown exception";
    }
    return out;
  }

  /// Under a tuner, a return value that is a JSON object is the trial's final result (Ray Tune's
  /// function trainables: `return {{"acc", acc}};`), reported as a last report() would be: in
  /// result.json, and seen by the searcher, the scheduler and the stoppers. Other values are not
  /// results.
  template <class Value>
  static void report_returned(context& ctx, Value const& value) {
    nlohmann::json const j = value;
    if (j.is_object()) ctx.report(j);
  }

  template <class P>
  decltype(auto) invoke_fn(context& ctx, P const& p) {
    if constexpr (std::is_invocable_v<Fn&, context&, P const&>) return fn_(ctx, p);
    else return fn_(ctx);
  }

  Fn fn_;
  std::tuple<Policies...> policies_;
  static inline scaling_type const default_scaling_{};
  static inline sharding_type const default_sharding_{};
  static inline checkpointing_type const default_checkpointing_{};
};

}  // namespace cohort
