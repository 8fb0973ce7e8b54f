#pragma once
/// \file
/// How a trainer's run is set up on every rank, each step agreed so that all ranks fail together:
/// the communicators it splits, the config agreed on (rank 0's, parsed on every rank), the run
/// directory opened and the point to resume from, and where the rank runs (topology, threads,
/// shared storage). Signal and position guards for the duration of fit().

#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/resume.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/detail/shared_storage.hpp"
#include "cohort/detail/utc_stamp.hpp"
#include "cohort/environment.hpp"
#include "cohort/report/protocol.hpp"
#include "cohort/run_config.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cuda.hpp"
#include "cohort/scaling/topology.hpp"

#if COHORT_WITH_TORCH
#include "cohort/torch/runtime_binding.hpp"
#include "cohort/torch/threads.hpp"
#endif

namespace cohort::detail::trainer {

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
  static void on_signal(int s) { comm::detail::stop_signal().store(s); }
  signal_guard() {
    comm::detail::stop_signal().store(0);
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

/// The run's collective deadline in ms (run_config::collective_timeout_ms), 0 for none.
inline int deadline_ms(run_config const& run) { return std::max(run.collective_timeout_ms, 0); }

/// A run's three duplicates of its communicator, each with the run's deadline: control (setup,
/// checkpoints, the end), work (the functor's collectives and its gradients) and check (the
/// lockstep agreement). Split in this order on every rank.
struct run_comms {
  template <comm::communicator C>
  run_comms(C& comm, run_config const& run)
      : control(comm.split(0, comm.rank())), work(comm.split(0, comm.rank())), check(comm.split(0, comm.rank())) {
    int const timeout_ms = deadline_ms(run);
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
template <class Param, class Scaling, class Config>
agreed_config<Param> agree_on_config(Scaling const& policy, Config const& config, run_config const& run,
                                     comm::any& control) {
  agreed_config<Param> out;
  auto& err = out.error;
  err = policy.check(control.size());
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
      err = "config " + out.text + " does not parse into " + type_name<Param>() + ": " +
            config_problem<Param>(nlohmann::json::parse(out.text, nullptr, false)) + e.what() +
            ": fix the config's keys and types (or its from_json)";
    }
    out.name = comm::broadcast_string(control, run.name.empty() ? "cohort_" + utc_stamp() : run.name);
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
                    report::protocol& reports, lockstep& steps, comm::any& control) {
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
                           .hparams = reports.under_tuner(),
                           .row_keys = reports.row_keys(),
                           .files = reports.files()});
      bool const fresh = reports.rows().fresh() && run.resume_from_checkpoint.empty();  // a new run directory
      if (!fresh) resume_text = cohort::checkpointing::resume_point(run_path, run.resume_from_checkpoint, reports.checkpoints()).dump();
    } catch (std::exception const& e) {
      err = e.what();
    }
  }
  err = comm::agree_on_error(control, err);
  if (err) return {.error = err, .resume = {}};
  auto resume = nlohmann::json::parse(comm::broadcast_string(control, resume_text));
  reports.set_attempt_prefix(comm::broadcast_string(control, std::to_string(::getpid()) + "_" + utc_stamp() + "_"));
  reports.rows().resume_at(resume.value("iteration", std::int64_t{0}));
  steps.resume_at(reports.rows().count());
  return {.error = std::nullopt, .resume = std::move(resume)};
}

/// Where this rank runs: its topology from every rank's host name and its intra-op threads (set
/// in LibTorch), or why it cannot run there. Cores are shared by every rank of the job on this
/// node; a rank bound to cores (mpirun) gets its own cores, shared with the ranks bound to them.
struct placement {
  std::optional<std::string> error;
  scaling::topology topo;
  int threads = 1;
};

/// place() without its checks: the topology in `comm` (every rank's host name into `hosts`
/// when given) and the intra-op threads, set in LibTorch. Collective.
template <class Scaling>
placement locate(Scaling const& policy, comm::any& comm, std::vector<std::string>* hosts = nullptr) {
  placement out;
  auto const names = comm::allgather_strings(comm, host_name());
  out.topo = scaling::topology_from_hosts(names, comm.rank());
  if (hosts) *hosts = names;
  if (job_ranks_on_node() > 0) {  // cohort initialised MPI: the job's ranks on this node are known
    out.topo.job_local_rank = job_local_rank();
    out.topo.job_local_size = job_ranks_on_node();
  }
  auto placed = out.topo;
  auto const cores =
      scaling::cores_of_this_rank(scaling::node_cores(), std::max(out.topo.local_world_size, job_ranks_on_node()));
  placed.local_world_size = cores.sharing_ranks;
  out.threads = policy.intra_op_threads(placed, cores.cores);
#if COHORT_WITH_TORCH
  set_intra_op_threads(out.threads);
  warn_if_runtime_shadowed();
#endif
  // A binding that costs CPU ranks training threads: said once per process, by each node's first rank.
  if (auto const& p = scaling::placement();
      p.known && job_local_rank() == 0 && policy.device_for(out.topo).kind == device_kind::cpu) {
    static bool said = false;
    if (!std::exchange(said, true)) {
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      auto const w = scaling::binding_warning(world_rank, p.mine, p.node, cores.sharing_ranks,
                                              std::max(out.topo.local_world_size, job_ranks_on_node()), out.threads);
      if (!w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
    }
  }
  return out;
}

/// Where this rank runs (locate), the storage checked to be shared where the run spans nodes,
/// and the scaling policy's placement check, agreed over `control`.
template <class Scaling>
placement place(Scaling const& policy, comm::any& control, std::filesystem::path const& run_path) {
  std::vector<std::string> hosts;
  auto out = locate(policy, control, &hosts);
  if (out.topo.num_nodes > 1)  // checkpoints are written by every rank and read back by every rank
    if ((out.error = check_shared_storage(control, run_path, hosts))) return out;
  if constexpr (requires { policy.placement_error(out.topo, 0); }) {
    if ((out.error = comm::agree_on_error(control, policy.placement_error(out.topo, scaling::visible_cuda_devices()))))
      return out;
  }
  return out;
}

}  // namespace cohort::detail::trainer
