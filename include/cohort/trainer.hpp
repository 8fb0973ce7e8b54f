#pragma once
/// \file
/// cohort::trainer: a user's training functor composed with scaling, sharding and checkpointing
/// policies into a data-parallel run over a communicator.

#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxabi.h>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/resume.hpp"
#include "cohort/checkpointing/validators.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/concepts.hpp"
#include "cohort/context.hpp"
#include "cohort/detail/callable.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/detail/shared_storage.hpp"
#include "cohort/detail/utc_stamp.hpp"
#include "cohort/environment.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/result.hpp"
#include "cohort/run_config.hpp"

#if COHORT_WITH_TORCH
#include "cohort/torch/runtime_binding.hpp"
#include "cohort/torch/threads.hpp"
#endif

namespace cohort {

namespace detail {

template <class P>
inline constexpr int policy_axes =
    int(scaling_policy<P>) + int(sharding_policy<P>) + int(checkpointing_policy<P>) + int(cohort::callback<P>);

/// Instantiated once per policy argument so that the error names the offending type.
template <class P>
struct check_policy {
  static_assert(policy_axes<P> >= 1 || std::is_same_v<P, cohort::datasets>,
                "cohort::trainer: this argument is not a policy: it must satisfy cohort::scaling_policy, "
                "cohort::sharding_policy or cohort::checkpointing_policy (see cohort/concepts.hpp), or "
                "cohort::callback (cohort/report/callbacks.hpp)");
  static_assert(policy_axes<P> <= 1, "cohort::trainer: this policy satisfies more than one policy concept");
  static constexpr bool value = true;
};

/// Copies of those of `ps` whose type satisfies `Is`, as a tuple (a policy pack's stoppers, callbacks).
template <template <class> class Is, class... Ps>
auto those_matching(Ps const&... ps) {
  return std::tuple_cat([](auto const& p) {
    if constexpr (Is<std::decay_t<decltype(p)>>::value) return std::tuple(p);
    else return std::tuple<>();
  }(ps)...);
}

template <class P> struct is_callback : std::bool_constant<cohort::callback<P>> {};

/// How many of `Ps` satisfy `Is`.
template <template <class> class Is, class... Ps>
inline constexpr int count_matching = (0 + ... + (Is<Ps>::value ? 1 : 0));

/// The first of `Ps` that satisfies `Is`, else `Default` (trainer and tuner check for duplicates).
template <template <class> class Is, class Default, class... Ps>
struct policy_or {
  using type = Default;
};
template <template <class> class Is, class Default, class P, class... Ps>
struct policy_or<Is, Default, P, Ps...> {
  using type = std::conditional_t<Is<P>::value, P, typename policy_or<Is, Default, Ps...>::type>;
};
template <class P> struct is_scaling : std::bool_constant<scaling_policy<P>> {};
template <class P> struct is_sharding : std::bool_constant<sharding_policy<P>> {};
template <class P> struct is_checkpointing : std::bool_constant<checkpointing_policy<P>> {};

template <class T, class... Ps>
T const& get_or(std::tuple<Ps...> const& ps, T const& fallback) {
  if constexpr ((std::is_same_v<T, Ps> || ...)) return std::get<T>(ps);
  else return fallback;
}

/// Where `config` fails to convert into `T`, as the start of an error ("field 'lr': "): each
/// field alone over a default `T`'s JSON, tried in turn; or a config that is not an object where
/// `T`'s JSON is one. Empty when T has no default or no to_json, or nothing single is found (a
/// missing required key, a nested field). Words errors only.
template <class T>
std::string config_problem(nlohmann::json const& config) {
  if constexpr (std::is_default_constructible_v<T> && requires { nlohmann::json(T{}); }) {
    try {
      auto const base = nlohmann::json(T{});
      if (!base.is_object()) return {};
      if (!config.is_object()) return std::string("a JSON ") + config.type_name() + ", not an object: ";
      for (auto const& [key, value] : config.items()) {
        auto one = base;
        one[key] = value;
        try {
          (void)one.template get<T>();
        } catch (std::exception const&) {
          return "field '" + key + "': ";
        }
      }
    } catch (std::exception const&) {
    }
  }
  return {};
}

template <class T>
std::string type_name() {
  int status = 0;
  char* d = abi::__cxa_demangle(typeid(T).name(), nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : typeid(T).name();
  std::free(d);
  return s;
}


/// Installs SIGTERM/SIGINT handlers that only record the signal, for the duration of fit();
/// the previous handlers are restored afterwards.
struct signal_guard {
  static void on_signal(int s) { stop_signal().store(s); }
  signal_guard() {
    stop_signal().store(0);
    struct sigaction sa {};
    sa.sa_handler = &on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
  }
  signal_guard(signal_guard const&) = delete;
  signal_guard& operator=(signal_guard const&) = delete;
  ~signal_guard() {
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGINT, &old_int, nullptr);
  }
  struct sigaction old_term {}, old_int {};
};

/// Gives `c`'s MPI communicator (when it is one) the run's deadline and a name for messages.
inline void set_comm_options(comm::any& c, comm::mpi_options options) {
  if (auto* m = c.target<comm::mpi>()) m->set_options(options);
}

/// A run's three duplicates of its communicator, each with the run's deadline: control (setup,
/// checkpoints, the end), work (the functor's collectives and its gradients) and check (the
/// lockstep agreement). Split in this order on every rank.
struct run_comms {
  template <comm::communicator C>
  run_comms(C& comm, int timeout_ms)
      : control(comm.split(0, comm.rank())), work(comm.split(0, comm.rank())), check(comm.split(0, comm.rank())) {
    set_comm_options(control, {.timeout_ms = timeout_ms, .name = "control"});
    set_comm_options(work, {.timeout_ms = timeout_ms, .name = "work"});
    set_comm_options(check, {.timeout_ms = timeout_ms, .name = "lockstep"});
  }
  comm::any control;
  comm::any work;
  comm::any check;
};

/// For the duration of fit(): deadline messages say where this rank's functor is.
struct position_guard {
  explicit position_guard(std::function<std::string()> f) { comm::detail::position().set(std::move(f)); }
  position_guard(position_guard const&) = delete;
  position_guard& operator=(position_guard const&) = delete;
  ~position_guard() { comm::detail::position().set({}); }
};

inline std::string host_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, static_cast<std::size_t>(len));
}

}  // namespace detail

/// A data-parallel trainer: `fn` run on every rank of a communicator, composed with up to one
/// policy per axis, in any order: scaling (default scaling::cpu{}), sharding (default
/// sharding::contiguous{}), checkpointing (default cohort::checkpointing::keep_all{}); and optionally the
/// named cohort::datasets that `ctx.dataset_shard(name)` reads.
///
/// `fn` is `fn(cohort::context&, Config const&)` or `fn(cohort::context&)`; it may return a
/// value (gathered from every rank into result::return_values; it must convert to JSON).
template <class Fn, class... Policies>
class trainer {
  static_assert((detail::check_policy<Policies>::value && ...));
  static_assert(detail::count_matching<detail::is_scaling, Policies...> <= 1 &&
                    detail::count_matching<detail::is_sharding, Policies...> <= 1 &&
                    detail::count_matching<detail::is_checkpointing, Policies...> <= 1,
                "cohort::trainer: two policies given for the same axis (scaling, sharding or checkpointing)");

 public:
  using scaling_type = typename detail::policy_or<detail::is_scaling, scaling::cpu, Policies...>::type;
  using sharding_type = typename detail::policy_or<detail::is_sharding, sharding::contiguous, Policies...>::type;
  using checkpointing_type =
      typename detail::policy_or<detail::is_checkpointing, cohort::checkpointing::keep_all, Policies...>::type;

  explicit trainer(Fn fn, Policies... policies) : fn_(std::move(fn)), policies_(std::move(policies)...) {}

  scaling_type const& scaling() const { return detail::get_or(policies_, default_scaling_); }
  sharding_type const& sharding() const { return detail::get_or(policies_, default_sharding_); }
  checkpointing_type const& checkpointing() const { return detail::get_or(policies_, default_checkpointing_); }

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
    return fit(config, run, comm, detail::report_listener{});
  }

  /// As above, with `listener` consulted after every report (rank 0 calls it, every rank learns
  /// its answer): how cohort::tuner runs a trial and stops it early.
  template <class Config, comm::communicator C>
  auto fit(Config const& config, run_config const& run, C& comm, detail::report_listener listener) {
    if (run.validators.ranks == 0) return fit_ranks(config, run, comm, std::move(listener), validate_fn{});
    return fit_with_validators(config, run, comm, std::move(listener));
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
                                                detail::report_listener listener) {
    result<return_of<Config>> out;
    int const timeout_ms = std::max(run.collective_timeout_ms, 0);
    comm::any all(comm.split(0, comm.rank()));
    detail::set_comm_options(all, {.timeout_ms = timeout_ms, .name = "validators' setup"});
    int const rank = all.rank();
    int thread_level = 0;
    MPI_Query_thread(&thread_level);
    if (auto e = comm::agree_on_error(all, cohort::checkpointing::validator_problem(run.validators, all.size(), thread_level)))
      return fail(std::move(out), *e, rank);
    int const first_validator = all.size() - run.validators.ranks;
    bool const validating = rank >= first_validator;
    comm::any group = all.split(validating ? 1 : 0, rank);
    comm::any link = all.split(rank == 0 || rank == first_validator ? 1 : 0, rank);  // trainer 0, validator 0
    detail::set_comm_options(link, {.timeout_ms = 0, .name = "validation link"});  // checkpoints come when they come
    if (!validating) {
      auto training = run;
      training.validators = {};
      validate_fn ask;
      if (rank == 0) ask = [&link](cohort::checkpoint const& c) { return cohort::checkpointing::ask_validators(link, c.path()); };
      out = fit_ranks(config, training, group, std::move(listener), std::move(ask));
      if (rank == 0) cohort::checkpointing::end_validators(link, detail::result_to_json(out));
      return out;
    }
    detail::set_comm_options(group, {.timeout_ms = 0, .name = "validators"});
    comm::any work = group.split(0, group.rank());
    detail::set_comm_options(work, {.timeout_ms = timeout_ms, .name = "validation"});
    auto const placed = locate(work);
    validator_context ctx(placed.topo, scaling().device_for(placed.topo), work);
    detail::signal_guard signals;  // SIGTERM/SIGINT stop the trainers at their next report, then these
    auto ended = detail::result_from_json<return_of<Config>>(cohort::checkpointing::serve_validations(
        group.rank() == 0 ? &link : nullptr, group, run.validators.validate, ctx, run.abort_timeout_ms));
    if (!ended.error) return ended;
    auto const message = *ended.error;
    return fail(std::move(ended), message, rank);
  }

  /// fit() on the ranks that train; `validate_every` (rank 0) validates every committed checkpoint.
  template <class Config, comm::communicator C>
  auto fit_ranks(Config const& config, run_config const& run, C& comm, detail::report_listener listener,
                 validate_fn validate_every) {
    using param_type = detail::config_param_t<Fn, Config>;
    constexpr bool takes_config = std::is_invocable_v<Fn&, context&, param_type const&>;
    static_assert(takes_config || std::is_invocable_v<Fn&, context&>,
                  "cohort::trainer: the functor must be callable as fn(cohort::context&, Config const&) "
                  "or fn(cohort::context&)");
    using return_type = return_of<Config>;
    result<return_type> out;

    int const timeout_ms = std::max(run.collective_timeout_ms, 0);  // 0: no deadline
    detail::run_comms comms(comm, timeout_ms);
    int const rank = comms.control.rank();
    auto setup = agree_on_config<param_type>(config, run, comms.control);
    auto const run_path = std::filesystem::path(run.storage_path) / setup.name;
    out.path = run_path;
    detail::lockstep steps(std::move(comms.check));
    // The run's callbacks, on rank 0, outside a tuner (whose callbacks see every trial).
    std::unique_ptr<report::callback_runner> callbacks;
    if (rank == 0 && !listener && !setup.error) callbacks = report::make_callback_runner(
          std::apply([](auto const&... p) { return detail::those_matching<detail::is_callback>(p...); }, policies_));
    report::experiment_info const info{.name = setup.name, .path = run_path, .world_size = comms.control.size()};
    detail::reporter reports(comms.control, steps,
                             {.rank = rank,
                              .run_path = run_path,
                              .mode = run.checkpoint_mode,
                              .listener = std::move(listener),
                              .callbacks = callbacks.get(),
                              .retain = [policy = checkpointing()](std::span<cohort::checkpointing::record const> all) {
                                return policy.retain(all);
                              },
                              .validate_every = std::move(validate_every)});
    auto opened = open_run(run, run_path, setup, reports, steps, comms.control);
    if (opened.error) return fail(std::move(out), *opened.error, rank);
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
    auto placed = place(comms.control, run_path);
    if (placed.error) return fail(std::move(out), *placed.error, rank);

    auto shard = [policy = sharding()](std::size_t n, int w, int r, std::int64_t e) { return policy.indices(n, w, r, e); };
    std::uint64_t seed = 0;
    if constexpr (requires(sharding_type const& p) { p.seed; }) seed = static_cast<std::uint64_t>(sharding().seed);
    static cohort::datasets const no_datasets{};
    context ctx(placed.topo, scaling().device_for(placed.topo), placed.threads, setup.name, run_path, comms.work, reports,
                shard, &detail::get_or(policies_, no_datasets), seed);
    if (opened.resume.contains("path"))
      ctx.set_resume_checkpoint(cohort::checkpoint::from_directory(opened.resume["path"].template get<std::string>()));
    ctx.set_collective_timeout_ms(timeout_ms);
    detail::position_guard where([&steps] { return steps.where(); });  // named in deadline messages
    detail::signal_guard signals;  // SIGTERM/SIGINT: stop at the next report, on every rank

    auto ran = call<return_type>(ctx, *setup.param, steps, reports);
    out.stopped = ran.stopped;
    if (ran.failure && !ran.preempted && !steps.broken()) tell_the_others(steps, *ran.failure, run.abort_timeout_ms, rank);
    if (auto e = complete(comms.control, reports, ran, run.abort_timeout_ms)) {
      out.preempted = ran.preempted;
      tell_end(e);
      return fail(std::move(out), *e, rank);
    }
    tell_end(std::nullopt);
    collect_results(out, comms.control, reports, ran);
    return out;
  }

  /// What setup agrees on: the config as every rank's functor takes it (rank 0's), its JSON text
  /// and the run's name; or the error, on every rank.
  template <class Param>
  struct agreed_config {
    std::optional<std::string> error;
    std::optional<Param> param;
    std::string text;
    std::string name;
  };

  /// The policies' and run_config's checks, then rank 0's config broadcast and parsed into the
  /// functor's config type on every rank, and the run's name. Every check is agreed over
  /// `control`, so all ranks fail together.
  template <class Param, class Config>
  agreed_config<Param> agree_on_config(Config const& config, run_config const& run, comm::any& control) const {
    agreed_config<Param> out;
    auto& err = out.error;
    err = scaling().check(control.size());
    if (!err && (run.collective_timeout_ms < 0 || run.abort_timeout_ms < 0))
      err = "run_config.collective_timeout_ms = " + std::to_string(run.collective_timeout_ms) +
            " and abort_timeout_ms = " + std::to_string(run.abort_timeout_ms) +
            ": give milliseconds (collective_timeout_ms = 0 for no deadline)";
    if (!err) {
      try {
        out.text = nlohmann::json(config).dump();
      } catch (std::exception const& e) {
        err = std::string("config does not convert to JSON: ") + e.what() + ": check its to_json";
      }
    }
    err = comm::agree_on_error(control, err);
    if (!err) {
      out.text = comm::broadcast_string(control, out.text);
      try {
        out.param.emplace(nlohmann::json::parse(out.text).template get<Param>());
      } catch (std::exception const& e) {
        err = "config " + out.text + " does not parse into " + detail::type_name<Param>() + ": " +
              detail::config_problem<Param>(nlohmann::json::parse(out.text, nullptr, false)) + e.what() +
              ": fix the config's keys and types (or its from_json)";
      }
      out.name = comm::broadcast_string(control, run.name.empty() ? "cohort_" + detail::utc_stamp() : run.name);
    }
    err = comm::agree_on_error(control, err);
    return out;
  }

  /// The run directory opened for reports (rank 0) and the async writer's thread started (every
  /// rank), agreed; then the point to resume from ({"path", "iteration"}, or {} on a fresh run),
  /// the same on every rank, with the report count and the lockstep moved to it.
  struct opened_run {
    std::optional<std::string> error;
    nlohmann::json resume;
  };

  template <class Param>
  opened_run open_run(run_config const& run, std::filesystem::path const& run_path, agreed_config<Param> const& setup,
                      detail::reporter& reports, detail::lockstep& steps, comm::any& control) const {
    auto err = setup.error;
    std::string resume_text = "{}";  // rank 0: nothing to resume from, unless found below
    if (!err && run.checkpoint_mode == checkpoint_mode::async) {
      try {
        reports.worker().warm_up();  // a thread: its failure is agreed on below
      } catch (std::exception const& e) {
        err = e.what();
      }
    }
    if (!err && control.rank() == 0) {
      try {
        // The console starts the worker's thread if async did not: agreed on below.
        reports.rows().open(run_path, nlohmann::json::parse(setup.text), setup.name,
                            {.console = run.verbose > 0,
                             .tensorboard = run.tensorboard,
                             .last_row_only = reports.under_tuner(),
                             .hparams = reports.under_tuner()});
        bool const fresh = reports.rows().directory().fresh() && run.resume_from_checkpoint.empty();  // a new run directory
        if (!fresh) resume_text = cohort::checkpointing::resume_point(run_path, run.resume_from_checkpoint, reports.checkpoints()).dump();
      } catch (std::exception const& e) {
        err = e.what();
      }
    }
    err = comm::agree_on_error(control, err);
    if (err) return {.error = err, .resume = {}};
    auto resume = nlohmann::json::parse(comm::broadcast_string(control, resume_text));
    reports.set_attempt_prefix(comm::broadcast_string(control, std::to_string(::getpid()) + "_" + detail::utc_stamp() + "_"));
    reports.rows().resume_at(resume.value("iteration", std::int64_t{0}));
    steps.resume_at(reports.rows().count());
    return {.error = std::nullopt, .resume = std::move(resume)};
  }

  /// Where this rank runs: its topology from every rank's host name, the storage checked to be
  /// shared where the run spans nodes, the scaling policy's placement check, and its intra-op
  /// threads (set in LibTorch). Cores are shared by every rank of the job on this node; a rank
  /// bound to cores (mpirun) gets its own cores, shared with the ranks bound to them.
  struct placement {
    std::optional<std::string> error;
    scaling::topology topo;
    int threads = 1;
  };

  placement place(comm::any& control, std::filesystem::path const& run_path) const {
    std::vector<std::string> hosts;
    auto out = locate(control, &hosts);
    if (out.topo.num_nodes > 1)  // checkpoints are written by every rank and read back by every rank
      if ((out.error = detail::check_shared_storage(control, run_path, hosts))) return out;
    if constexpr (requires(scaling_type const& p) { p.placement_error(out.topo, 0); }) {
      if ((out.error = comm::agree_on_error(control, scaling().placement_error(out.topo, scaling::visible_cuda_devices()))))
        return out;
    }
    return out;
  }

  /// place() without its checks: the topology in `comm` (every rank's host name into `hosts`
  /// when given) and the intra-op threads, set in LibTorch. Collective.
  placement locate(comm::any& comm, std::vector<std::string>* hosts = nullptr) const {
    placement out;
    auto const names = comm::allgather_strings(comm, detail::host_name());
    out.topo = scaling::topology_from_hosts(names, comm.rank());
    if (hosts) *hosts = names;
    if (detail::job_ranks_on_node() > 0) {  // cohort initialised MPI: the job's ranks on this node are known
      out.topo.job_local_rank = detail::job_local_rank();
      out.topo.job_local_size = detail::job_ranks_on_node();
    }
    auto placed = out.topo;
    auto const cores =
        scaling::cores_of_this_rank(scaling::node_cores(), std::max(out.topo.local_world_size, detail::job_ranks_on_node()));
    placed.local_world_size = cores.sharing_ranks;
    out.threads = scaling().intra_op_threads(placed, cores.cores);
#if COHORT_WITH_TORCH
    cohort::detail::set_intra_op_threads(out.threads);
    cohort::detail::warn_if_runtime_shadowed();
#endif
    // A binding that costs CPU ranks training threads: said once per process, by each node's first rank.
    if (auto const& p = scaling::placement();
        p.known && detail::job_local_rank() == 0 && scaling().device_for(out.topo).kind == device_kind::cpu) {
      static bool said = false;
      if (!std::exchange(said, true)) {
        int world_rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        auto const w = scaling::binding_warning(world_rank, p.mine, p.node, cores.sharing_ranks,
                                                std::max(out.topo.local_world_size, detail::job_ranks_on_node()), out.threads);
        if (!w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
      }
    }
    return out;
  }

  /// How the functor's call ended on this rank: its value, or the failure it is held with until
  /// every rank has finished (`secondary`: another rank failed, and its error is the one
  /// reported), a SIGTERM/SIGINT, or the tuner's stop.
  template <class Return>
  struct outcome {
    std::optional<std::conditional_t<std::is_void_v<Return>, detail::no_return, Return>> value;
    std::optional<std::string> failure;
    bool secondary = false;
    bool preempted = false;
    std::optional<std::string> stopped;
  };

  /// The functor. Any exception is held until every rank has finished; the other ranks learn of
  /// it at their next agreement (lockstep), or the job is aborted after abort_timeout_ms.
  template <class Return, class Param>
  outcome<Return> call(context& ctx, Param const& param, detail::lockstep& steps, detail::reporter& reports) {
    outcome<Return> out;
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
    } catch (detail::stopped_by_tuner const& s) {
      out.stopped = s.reason;
    } catch (detail::preempted const& p) {
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

  /// A rank that failed on its own tells the others at their next agreement point; it waits at
  /// most `abort_timeout_ms` for them to get there, then aborts the job rather than hang.
  static void tell_the_others(detail::lockstep& steps, std::string const& failure, int abort_timeout_ms, int rank) {
    auto settle = [&] {  // the agreement in flight, waited for at most abort_timeout_ms
      comm::detail::wait_or_abort([&] { return steps.test(); }, abort_timeout_ms, rank, failure);
      try {
        steps.finish();
      } catch (detail::diverged const&) {  // the others were elsewhere: they now stop too
      }
    };
    if (steps.pending()) settle();  // one the functor left started (a backward that threw)
    if (!steps.broken()) {
      steps.start(detail::step::failed);
      settle();
    }
  }

  /// Completion, agreed over `control`: [failed (2: its own error, 1: another rank's), max
  /// reports, -min reports]. Returns the run's error: the errors of the ranks that failed on
  /// their own (the others only say they stopped), or report counts that differ. A failed rank
  /// waits at most `abort_timeout_ms` for the others, then aborts the job rather than hang.
  template <class Return>
  static std::optional<std::string> complete(comm::any& control, detail::reporter& reports, outcome<Return> const& ran,
                                             int abort_timeout_ms) {
    auto const& failure = ran.failure;
    std::int64_t status[3] = {failure ? (ran.secondary ? 1 : 2) : 0, reports.rows().reports_this_attempt(),
                              -reports.rows().reports_this_attempt()};
    auto req = control.iallreduce(status, 3, comm::reduce_op::max);
    // The progress lines before any error or result. They share a thread with async checkpoint
    // writes, so after a failure a write may still be in flight: the completion is tested (and
    // so progresses) meanwhile, and the other ranks' abort_timeout_ms does not run out on it.
    bool completed = false;
    if (reports.rows().has_console())
      while (!reports.worker().wait_for(std::chrono::milliseconds(1))) completed = completed || req.test();
    if (!completed && failure) comm::detail::wait_or_abort([&] { return req.test(); }, abort_timeout_ms, control.rank(), *failure);
    else if (!completed) req.wait();
    if (status[0] != 0) return comm::agree_on_error(control, status[0] == 2 && ran.secondary ? std::nullopt : failure);
    if (status[1] != -status[2])
      return "report() was called " + std::to_string(-status[2]) + " times on some rank and " + std::to_string(status[1]) +
             " on another: every rank must call report() the same number of times";
    return std::nullopt;
  }

  /// The results, identical on every rank: the metrics (under a tuner the history is the
  /// tuner's, in its result_grid, and only the last report comes back), the latest and the
  /// retained checkpoints, and every rank's return value.
  template <class Return>
  void collect_results(result<Return>& out, comm::any& control, detail::reporter& reports, outcome<Return>& ran) const {
    int const rank = control.rank();
    std::string history;
    if (rank == 0) {
      auto const& rows = reports.rows().history();
      history = reports.under_tuner() ? nlohmann::json(rows.empty() ? std::vector<nlohmann::json>{} : std::vector<nlohmann::json>{rows.back()}).dump()
                                      : nlohmann::json(rows).dump();
    }
    for (auto& row : nlohmann::json::parse(comm::broadcast_string(control, history))) out.metrics_history.push_back(std::move(row));
    if (!out.metrics_history.empty()) out.metrics = out.metrics_history.back();
    if (rank == 0) reports.checkpoints().finish_validation();
    auto ckpts = nlohmann::json::parse(comm::broadcast_string(control, rank == 0 ? cohort::checkpointing::summary(reports.checkpoints(), checkpointing()).dump() : std::string{}));
    out.best_checkpoints = ckpts["best"].template get<std::vector<checkpoint_info>>();
    if (ckpts.contains("latest")) out.checkpoint = ckpts["latest"].template get<checkpoint_info>();
    if (out.stopped) {
      // Ended by the tuner on every rank at the same report: the functor returned nothing.
    } else if constexpr (std::is_void_v<Return>) {
      out.return_values.resize(static_cast<std::size_t>(control.size()));
    } else {
      auto all = comm::allgather_strings(control, nlohmann::json(*ran.value).dump());
      for (auto const& s : all) out.return_values.push_back(nlohmann::json::parse(s).template get<Return>());
    }
  }

  template <class P>
  decltype(auto) invoke_fn(context& ctx, P const& p) {
    if constexpr (std::is_invocable_v<Fn&, context&, P const&>) return fn_(ctx, p);
    else return fn_(ctx);
  }

  template <class R>
  static R fail(R out, std::string const& message, int rank) {
    // One write per line, so that lines from different ranks do not interleave.
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + message + "\n") << std::flush;
    out.error = message;
    return out;
  }

  Fn fn_;
  std::tuple<Policies...> policies_;
  static inline scaling_type const default_scaling_{};
  static inline sharding_type const default_sharding_{};
  static inline checkpointing_type const default_checkpointing_{};
};

}  // namespace cohort
