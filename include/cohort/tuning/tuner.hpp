#pragma once
/// \file
/// cohort::tuner: hyperparameter search inside one MPI job. The world is split into groups of
/// `ranks_per_trial`; each group runs one trial at a time (a data-parallel trainer on the group's
/// communicator). Rank 0 also runs a coordinator thread that owns the searcher, the scheduler and
/// the stoppers: group leaders send it each result and get its decision back (results it is sure
/// to answer "proceed" go without waiting), so decisions are made as results arrive and a slow
/// trial never blocks the others. No service, no driver.

#include <mpi.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/validators.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/detail/thread_start.hpp"
#include "cohort/environment.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/run_config.hpp"
#include "cohort/trainer.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/coordinator.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/messages.hpp"
#include "cohort/tuning/result_grid.hpp"
#include "cohort/tuning/schedulers.hpp"
#include "cohort/tuning/search_space.hpp"
#include "cohort/tuning/searchers.hpp"
#include "cohort/tuning/stoppers.hpp"
#include "cohort/tuning/trainable.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort {

namespace tuning::detail {

template <class T>
struct is_trainer : std::false_type {};
template <class F, class... P>
struct is_trainer<cohort::trainer<F, P...>> : std::true_type {};

template <class P>
inline constexpr int tuner_axes = int(cohort::searcher<P>) + int(cohort::scheduler<P>) + int(cohort::stopper<P>) +
                                  int(cohort::callback<P>) + int(std::is_same_v<P, cohort::tune_config>);

template <class P>
struct check_tuner_policy {
  static_assert(tuner_axes<P> >= 1,
                "cohort::tuner: this argument is not a tuning policy: it must satisfy cohort::searcher, "
                "cohort::scheduler, cohort::stopper (see cohort/tuning/concepts.hpp) or cohort::callback "
                "(cohort/report/callbacks.hpp), or be a cohort::tune_config");
  static_assert(tuner_axes<P> <= 1, "cohort::tuner: this policy satisfies more than one tuning concept");
  static constexpr bool value = true;
};

template <class P> struct is_searcher : std::bool_constant<cohort::searcher<P>> {};
template <class P> struct is_scheduler : std::bool_constant<cohort::scheduler<P>> {};
template <class P> struct is_config : std::is_same<P, cohort::tune_config> {};

template <class P> struct is_stopper : std::bool_constant<cohort::stopper<P>> {};

/// The trainer that runs each trial: the user's trainer, or one around a functor or class trainable.
template <class Trainable>
auto make_trainer(Trainable t, tune_config const& cfg) {
  if constexpr (is_trainer<Trainable>::value) return t;
  else if constexpr (trainable_class<Trainable>) return cohort::trainer{trainable_functor<Trainable>{std::move(t), cfg.checkpoint_frequency}};
  else return cohort::trainer{std::move(t)};
}

}  // namespace tuning::detail

/// Hyperparameter search inside the MPI job (Ray Tune without a cluster):
/// `cohort::tuner tuner{train, cohort::search::random{.seed = 1}, cohort::schedule::asha{.max_t = 20},
///                      cohort::tune_config{.metric = "accuracy", .mode = cohort::max, .num_samples = 16}};`
/// `auto grid = tuner.fit(cohort::space{{"lr", cohort::loguniform(1e-4, 1e-1)}});`
///
/// `Trainable` is a cohort::trainer (its policies apply to every trial), a trainer functor
/// `fn(cohort::context&, Config const&)` (a single-rank function when ranks_per_trial is 1), or a
/// class trainable (cohort::trainable_class). The policies, in any order: at most one searcher
/// (default search::basic), at most one scheduler (default schedule::fifo), any number of
/// stoppers (any one stops), any number of callbacks (cohort::callback: told of every trial's
/// start, results, checkpoints and end on a thread of rank 0), at most one tune_config.
template <class Trainable, class... Policies>
class tuner {
  static_assert((tuning::detail::check_tuner_policy<Policies>::value && ...));
  static_assert(cohort::detail::trainer::count_matching<tuning::detail::is_searcher, Policies...> <= 1 &&
                    cohort::detail::trainer::count_matching<tuning::detail::is_scheduler, Policies...> <= 1 &&
                    cohort::detail::trainer::count_matching<tuning::detail::is_config, Policies...> <= 1,
                "cohort::tuner: two searchers, two schedulers or two tune_configs given");

 public:
  using searcher_type = typename cohort::detail::trainer::policy_or<tuning::detail::is_searcher, search::basic, Policies...>::type;
  using scheduler_type = typename cohort::detail::trainer::policy_or<tuning::detail::is_scheduler, schedule::fifo, Policies...>::type;
  using stoppers_type = decltype(cohort::detail::trainer::those_matching<tuning::detail::is_stopper>(std::declval<Policies const&>()...));
  using callbacks_type = decltype(cohort::detail::trainer::those_matching<cohort::detail::trainer::is_callback>(std::declval<Policies const&>()...));

  explicit tuner(Trainable trainable, Policies... policies)
      : config_(config_argument(policies...)),
        searcher_(policy_argument<searcher_type>(policies...)),
        scheduler_(policy_argument<scheduler_type>(policies...)),
        stoppers_(cohort::detail::trainer::those_matching<tuning::detail::is_stopper>(policies...)),
        callbacks_(cohort::detail::trainer::those_matching<cohort::detail::trainer::is_callback>(policies...)),
        trainer_(tuning::detail::make_trainer(std::move(trainable), config_)) {}

  tune_config const& config() const { return config_; }

  /// Runs the experiment on every rank of MPI_COMM_WORLD (every rank calls it): trials of
  /// `space` in groups of ranks_per_trial, each trial's files under
  /// <storage_path>/<name>/trial_NNNNN/, the experiment's experiment_state.json and trials.csv
  /// next to them, and a status table on rank 0. Rerunning with the same run.name resumes an
  /// interrupted experiment: finished trials are kept, unfinished ones resume from their latest
  /// checkpoints, the searcher and scheduler from their saved state. The result is the same on
  /// every rank; bad input is result_grid::error on every rank, with one line on stderr.
  tuning::result_grid fit(tuning::space const& space, run_config const& run = {}) {
    cohort::detail::ensure_mpi_for_program();
    tuning::result_grid out;
    out.objective = {config_.metric, config_.mode};
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int const timeout_ms = cohort::detail::trainer::deadline_ms(run);
    comm::mpi world(comm, comm::ownership::owned, {.timeout_ms = timeout_ms, .name = "tuner"});
    int const rank = world.rank();
    if (auto err = job_error(world.size(), run)) return fail(std::move(out), *err, rank);

    auto name = comm::broadcast_string(world, run.name.empty() ? "tune_" + cohort::detail::utc_stamp() : run.name);
    auto exp = std::filesystem::path(run.storage_path) / name;
    out.path = exp;
    std::optional<coordinator_type> coord;
    if (auto e = comm::agree_on_error(world, rank == 0 ? start_coordinator(coord, space, run, exp, comm, world.size()) : std::nullopt))
      return fail(std::move(out), *e, rank);

    std::unique_ptr<report::callback_runner> callbacks;
    report::experiment_info const info{.name = name, .path = exp, .world_size = world.size(), .tuning = true,
                                       .metric = config_.metric, .mode = config_.mode};
    std::thread server;
    if (rank == 0) {
      callbacks = report::make_callback_runner(callbacks_);
      if (callbacks) {
        callbacks->experiment_start(info);
        coord->set_callbacks(callbacks.get());
      }
      server = std::thread([&] {
        cohort::detail::begin_background_thread("cohort-tuner");
        coord->serve();
      });
    }
    cohort::detail::trainer::signal_guard signals;  // SIGTERM/SIGINT between trials: no new trial starts
    run_trials(coord, run, exp, comm, world, timeout_ms);
    // The grid goes to the other ranks while rank 0's coordinator writes the experiment's last
    // files (experiment_state.json, trials.csv, report.html); fit() returns once they are written.
    if (server.joinable()) coord->wait_ended();
    out = gather_results(std::move(out), coord, world);
    if (server.joinable()) server.join();
    if (callbacks) callbacks->finish(&info);
    return out;
  }

 private:
  using coordinator_type = tuning::detail::coordinator<searcher_type, scheduler_type, stoppers_type>;

  /// What makes the job unfit for an experiment, the same on every rank: MPI without threads,
  /// ranks_per_trial that does not divide the ranks, validator ranks that leave a trial no rank to
  /// train (run_config::validators, within each trial's group), no samples.
  std::optional<std::string> job_error(int size, run_config const& run) const {
    int provided = 0;
    MPI_Query_thread(&provided);
    int const per = config_.ranks_per_trial;
    if (provided < MPI_THREAD_MULTIPLE)
      return "cohort::tuner needs MPI initialised with MPI_THREAD_MULTIPLE: let cohort::environment initialise MPI";
    if (per < 1 || size % per != 0)
      return "tune_config.ranks_per_trial = " + std::to_string(per) + " does not divide the " + std::to_string(size) +
             " ranks of the job: launch with a multiple of it (mpirun -np " + std::to_string(std::max(per, 1)) + ", " +
             std::to_string(2 * std::max(per, 1)) + ", ...) or change ranks_per_trial";
    if (auto e = cohort::checkpointing::validator_problem(run.validators, per, provided))
      return "each trial's group of tune_config.ranks_per_trial = " + std::to_string(per) + " ranks: " + *e;
    if (config_.num_samples == 0) return "tune_config.num_samples = 0: set it to at least 1";
    if (config_.resume_errored && config_.restart_errored)
      return "tune_config.resume_errored and restart_errored are both set: choose one (resume from the latest "
             "checkpoint, or start over)";
    if constexpr (std::is_same_v<scheduler_type, schedule::pbt>) {
      if (config_.reproducible && !scheduler_.synch)
        return "tune_config.reproducible needs schedule::pbt{.synch = true}: asynchronous PBT ranks each trial against "
               "whatever results the others have reached";
    } else if constexpr (!std::is_same_v<scheduler_type, schedule::fifo> && !std::is_same_v<scheduler_type, schedule::asha> &&
                         !std::is_same_v<scheduler_type, schedule::hyperband>) {
      if (config_.reproducible)
        return "tune_config.reproducible covers schedule::fifo, asha, hyperband and pbt{.synch = true}; this scheduler "
               "decides on results in the order they arrive: leave reproducible off, or use one of those";
    }
    if (config_.max_failures < -1)
      return "tune_config.max_failures = " + std::to_string(config_.max_failures) +
             ": set it to a retry count, 0 for none, or -1 for no limit";
    return std::nullopt;
  }

  /// Rank 0: the experiment directory made and the coordinator started in `coord` (restored from
  /// the directory's experiment_state.json when there is one). Returns the error, if any.
  std::optional<std::string> start_coordinator(std::optional<coordinator_type>& coord, tuning::space const& space,
                                               run_config const& run, std::filesystem::path const& exp, MPI_Comm comm,
                                               int size) {
    std::vector<int> leaders;
    for (int r = 0; r < size; r += config_.ranks_per_trial) leaders.push_back(r);
    try {
      std::error_code ec;
      std::filesystem::create_directories(exp, ec);
      if (ec || !std::filesystem::is_directory(exp))
        throw cohort::error("cannot create experiment directory " + exp.string() + " (" +
                            (ec ? ec.message() : std::string("not a directory")) +
                            "): set run_config.storage_path to a writable directory");
      coord.emplace(searcher_, scheduler_, stoppers_, config_, exp, leaders, comm, run.verbose);
      coord->start(space);
      if (coord->restored() && run.verbose > 0)
        std::cout << "[cohort] resuming experiment " + exp.string() + " from its experiment_state.json\n" << std::flush;
    } catch (std::exception const& e) {
      return e.what();
    }
    return std::nullopt;
  }

  /// Every rank, in its trial group of ranks_per_trial: trials as the coordinator assigns them
  /// (its leader asks, the group learns the answer), until it says done.
  void run_trials(std::optional<coordinator_type>& coord, run_config const& run, std::filesystem::path const& exp,
                  MPI_Comm comm, comm::mpi& world, int timeout_ms) {
    int const rank = world.rank(), per = config_.ranks_per_trial;
    comm::mpi group = world.split(rank / per, rank);
    group.set_options({.timeout_ms = timeout_ms, .name = "trial group"});
    bool const leader = group.rank() == 0;
    run_config trial_run = run;
    trial_run.storage_path = exp.string();
    trial_run.verbose = run.verbose >= 2 ? 1 : 0;
    std::optional<cohort::detail::trainer::run_comms> comms;  // the trainer's, kept while trials end cleanly
    tuning::detail::sent_in_order told;  // before `files`: its jobs count on it
    cohort::report::file_writer files;   // the leader's trials' files, written beside their training
    // The leader's messages to the coordinator go in order with its trials' files (`told`): a
    // trial's completion once its files are written (their failure is the trial's), for a short
    // trial on the files' thread where they are written beside training, so the next trial
    // starts without waiting for them; a request after it. The leader asks for a trial when it has none, then for the
    // next one as each trial starts (ahead), keeping requests_ahead unanswered: the coordinator
    // answers at once where it can reserve one (trial_book::reservation), else once the group has
    // no trial, and the answers wait for the leader here, one per request, in order.
    auto const ask = [&](nlohmann::json request) {
      told.start(files, [&, request = std::move(request)] {
        if (rank == 0) return coord->local_ask(request);
        tuning::detail::send_json(comm, 0, tuning::detail::request_tag, request);
      });
    };
    std::size_t asked = 0;  // requests not answered yet
    for (;;) {
      std::string text;
      if (leader) {
        if (asked == 0) {
          ask(nlohmann::json::object());
          asked = 1;
        }
        --asked;
        text = rank == 0 ? coord->local_answer().dump()
                         : tuning::detail::recv_json(comm, 0, tuning::detail::assignment_tag).dump();
      }
      // The leader waits for the coordinator as long as other trials run: no deadline on this one.
      group.set_options({.timeout_ms = 0, .name = "trial group"});
      auto assignment = nlohmann::json::parse(comm::broadcast_string(group, text));
      group.set_options({.timeout_ms = timeout_ms, .name = "trial group"});
      if (assignment.contains("done")) break;
      auto const id = assignment.at("trial_id").get<std::string>();
      trial_run.name = id;
      trial_run.resume_from_checkpoint = assignment.value("restore_from", std::string{});
      if (leader) {
        ask({{"ahead", id}});
        for (++asked; asked < tuning::detail::requests_ahead; ++asked) ask({{"ahead", nullptr}});
      }
      auto const began = std::chrono::steady_clock::now();
      auto r = run_trial(coord, assignment, trial_run, comm, group, comms, files, told, rank);
      bool const short_trial = std::chrono::steady_clock::now() - began < tuning::detail::short_trial;
      if (leader) {
        nlohmann::json msg{{"trial_id", id},
                           {"outcome", r.preempted ? "preempted" : r.error ? "error" : r.stopped.value_or("finished")}};
        if (r.error) msg["error"] = *r.error;
        if (!r.error && !r.preempted) {  // the checkpoints it retained, in the order a listing has them
          std::vector<std::string> names;
          for (auto const& c : r.best_checkpoints) names.push_back(c.path.filename().string());
          std::sort(names.begin(), names.end());
          msg["checkpoints"] = names;
        }
        told.end_run(files, [&, msg = std::move(msg)](std::optional<std::string> const& files_failed) mutable {
          if (files_failed && msg["outcome"] != "error" && msg["outcome"] != "preempted") {
            msg["outcome"] = "error";
            msg["error"] = *files_failed;
            msg.erase("checkpoints");
          }
          if (rank == 0) coord->local_complete(msg);
          else tuning::detail::send_json(comm, 0, tuning::detail::complete_tag, msg);
        }, !short_trial);
      }
    }
    if (leader) told.wait();
  }

  /// One trial on this rank's group: the trainer run with a listener that sends every report to
  /// the coordinator and returns its decision (without waiting for it where the coordinator said
  /// it would be proceed: quiet_results), each row carrying the trial's `num_failures`. A
  /// signal that arrived between trials stops the experiment before this one starts (the trial
  /// stays pending); the trainer's own guard handles signals during the trial. The trainer runs
  /// on `comms`, split from `group` when empty and emptied after a trial that failed (a failure
  /// may leave messages unreceived), the same on every rank of the group as the trial's outcome is.
  /// The group's leader writes the trial's files on `files`; run_trials tells the trial's end once
  /// they are written (an error if they could not be), and its results wait for `told`.
  cohort::result<void> run_trial(std::optional<coordinator_type>& coord, nlohmann::json const& assignment,
                                 run_config const& trial_run, MPI_Comm comm, comm::mpi& group,
                                 std::optional<cohort::detail::trainer::run_comms>& comms,
                                 cohort::report::file_writer& files, tuning::detail::sent_in_order& told, int rank) {
    nlohmann::json const& config = assignment.at("config");
    auto const num_failures = assignment.value("num_failures", std::size_t{0});
    tuning::detail::quiet_results quiet;
    quiet.answered(assignment);  // it may name the first results sent without waiting
    tuning::detail::quiet_sends sends;  // waited for when the trial ends, before its completion is sent
    tuning::detail::quiet_batch batch;  // quiet results not sent yet: sent before any other message
    cohort::report::listener listener{
        .decide = [&, id = trial_run.name](nlohmann::json const& row) {
          told.wait();  // the trial's start (and the last trial's end) told first
          if (rank == 0) return coord->local_result({{"trial_id", id}, {"row", row}});
          if (quiet.send_quiet(row)) {  // the coordinator is sure to answer proceed: not waited for
            if (batch.add(row)) sends.send(comm, 0, tuning::detail::result_tag, batch.take(id));
            return nlohmann::json{{"what", "proceed"}};
          }
          if (!batch.empty()) sends.send(comm, 0, tuning::detail::result_tag, batch.take(id));
          sends.send(comm, 0, tuning::detail::result_tag, {{"trial_id", id}, {"row", row}});
          auto reply = tuning::detail::recv_json(comm, 0, tuning::detail::reply_tag);
          quiet.answered(reply);
          return reply;
        },
        .row_keys = {{"num_failures", num_failures}},
        .files = &files};
    std::int32_t signal = comm::detail::stop_signal().load();
    group.allreduce(&signal, 1, comm::reduce_op::max);
    cohort::result<void> r;
    if (signal != 0) {
      r.preempted = true;
      r.error = std::string("stopped by ") + (signal == SIGINT ? "SIGINT" : "SIGTERM");
      return r;
    }
    if (trial_run.validators.ranks == 0 && !comms) comms.emplace(group, trial_run);
    auto run_result = trial_run.validators.ranks > 0 ? trainer_.fit(config, trial_run, group, listener)
                                                     : trainer_.fit(config, trial_run, *comms, listener);
    if (!batch.empty()) sends.send(comm, 0, tuning::detail::result_tag, batch.take(trial_run.name));
    sends.wait();
    if (run_result.error || run_result.preempted) comms.reset();
    r.preempted = run_result.preempted;
    r.error = run_result.error;
    r.stopped = run_result.stopped;
    r.best_checkpoints = std::move(run_result.best_checkpoints);
    if (r.preempted) comm::detail::stop_signal().store(SIGTERM);  // the trainer's guard is gone: keep it stopped
    return r;
  }

  /// The result grid, the same on every rank: rank 0 moves it out of the coordinator and sends
  /// it as MessagePack (encode_trials: the histories as history bytes, the other values moved,
  /// not copied); the others decode it.
  tuning::result_grid gather_results(tuning::result_grid out, std::optional<coordinator_type>& coord, comm::mpi& world) {
    int const rank = world.rank();
    if (rank == 0) out.trials = coord->take_trials();
    if (world.size() > 1) {
      std::string text;
      if (rank == 0) text = tuning::detail::encode_trials(out.trials);
      text = comm::broadcast_string(world, std::move(text));
      if (rank != 0) out.trials = tuning::detail::decode_trials(text);
    }
    nlohmann::json const outcome =
        nlohmann::json::parse(comm::broadcast_string(world, rank == 0 ? coord->outcome().dump() : std::string{}));
    out.preempted = outcome.value("preempted", false);
    if (outcome.contains("error")) return fail(std::move(out), outcome["error"].get<std::string>(), rank);
    return out;
  }

  static tuning::result_grid fail(tuning::result_grid out, std::string const& message, int rank) {
    std::cerr << ("[cohort] rank " + std::to_string(rank) + ": error: " + message + "\n") << std::flush;
    out.error = message;
    return out;
  }

  template <class T, class... Ps>
  static T policy_argument(Ps const&... ps) {
    std::optional<T> found;
    ([&] {
      if constexpr (std::is_same_v<Ps, T>) found.emplace(ps);
    }(), ...);
    return found ? *found : T{};
  }
  template <class... Ps>
  static tune_config config_argument(Ps const&... ps) {
    return policy_argument<tune_config>(ps...);
  }

  tune_config config_;
  searcher_type searcher_;
  scheduler_type scheduler_;
  stoppers_type stoppers_;
  callbacks_type callbacks_;
  decltype(tuning::detail::make_trainer(std::declval<Trainable>(), std::declval<tune_config const&>())) trainer_;
};

}  // namespace cohort
