#pragma once
/// \file
/// Which cores a rank and its background threads run on. `mpirun` binds each rank to cores
/// (Open MPI: one core per rank when it starts two or fewer, else a socket), and every thread a
/// rank starts inherits that binding: the checkpoint writer, the validation, the data loader's
/// producer and the all-reduce thread would all share the training thread's core while other
/// cores of the node stay idle. cohort finds the cores no rank of the job on this node is bound
/// to (the spare cores) when it initialises MPI and runs its background threads there; with none
/// spare they stay on the rank's own cores, as before. The decisions are pure functions.

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace cohort::scaling {

/// CPU numbers, ascending, no duplicates.
using cpu_list = std::vector<int>;

/// Pure: the CPUs of a Linux CPU list ("0-3,8,10-11", as in /sys/devices/system/cpu/online or
/// cpuset.cpus.effective); empty when `text` is empty or malformed.
inline cpu_list parse_cpu_list(std::string_view text) {
  auto number = [](std::string_view s, int& v) {  // all of `s`, a CPU number
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc{} && end == s.data() + s.size() && v >= 0;
  };
  cpu_list out;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  while (!text.empty()) {
    auto const comma = text.find(',');
    auto const item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    auto const dash = item.find('-');
    int lo = 0, hi = 0;
    if (!number(item.substr(0, dash), lo)) return {};
    if (dash == std::string_view::npos) hi = lo;
    else if (!number(item.substr(dash + 1), hi) || hi < lo) return {};
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// Pure: the CPUs of `node` that none of `ranks` (each rank's binding, this node's ranks) may
/// run on. Empty when every core is bound, or when the ranks are not bound at all.
inline cpu_list spare_cpus(cpu_list const& node, std::vector<cpu_list> const& ranks) {
  cpu_list out;
  for (int c : node)
    if (std::none_of(ranks.begin(), ranks.end(), [c](cpu_list const& r) { return std::binary_search(r.begin(), r.end(), c); }))
      out.push_back(c);
  return out;
}

/// Pure: how many of `ranks` may run on at least one CPU of `mine` (this rank's own binding
/// among them): the ranks that share its cores.
inline int ranks_sharing(cpu_list const& mine, std::vector<cpu_list> const& ranks) {
  return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [&](cpu_list const& r) {
    return std::any_of(r.begin(), r.end(), [&](int c) { return std::binary_search(mine.begin(), mine.end(), c); });
  }));
}

/// A CPU list as a fixed-size bitmap (CPUs below 1024, Linux's CPU_SETSIZE), for one allgather.
using cpu_bitmap = std::array<unsigned char, 128>;

/// Pure: `cpus` as a bitmap (CPUs from 1024 on are left out).
inline cpu_bitmap to_bitmap(cpu_list const& cpus) {
  cpu_bitmap b{};
  for (int c : cpus)
    if (c >= 0 && c < 1024) b[static_cast<std::size_t>(c / 8)] |= static_cast<unsigned char>(1u << (c % 8));
  return b;
}

/// Pure: the CPUs set in `b`.
inline cpu_list from_bitmap(cpu_bitmap const& b) {
  cpu_list out;
  for (int c = 0; c < 1024; ++c)
    if (b[static_cast<std::size_t>(c / 8)] & (1u << (c % 8))) out.push_back(c);
  return out;
}

/// Where the job's ranks on this node run, found when cohort initialised MPI: the node's CPUs,
/// this rank's binding, every local rank's binding and the spare CPUs. `known` is false when
/// MPI was initialised by someone else (then nothing is moved and thread counts use the node's
/// cores).
struct cpu_placement {
  bool known = false;
  cpu_list node;                ///< the CPUs this node lets the job use
  cpu_list mine;                ///< this rank's binding (the main thread's affinity at MPI init)
  std::vector<cpu_list> ranks;  ///< the binding of every rank of the job on this node
  cpu_list spare;               ///< spare_cpus(node, ranks): where background threads run
};

/// This process's placement (filled once by cohort::environment's MPI initialisation).
inline cpu_placement& placement() {
  static cpu_placement p;
  return p;
}

/// CPUs 0..hardware_concurrency-1 (at least CPU 0): where nothing better is known.
inline cpu_list first_cpus() {
  cpu_list out;
  for (int c = 0; c < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); ++c) out.push_back(c);
  return out;
}

/// The CPUs the calling thread may run on (Linux: its affinity; elsewhere: first_cpus()).
inline cpu_list this_thread_cpus() {
#if defined(__linux__)
  cpu_list out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }
#endif
  return first_cpus();
}

/// Pure: the CPUs of the `Cpus_allowed_list:` line of a /proc/PID/status text; empty when it
/// has none.
inline cpu_list allowed_cpus_in_status(std::string_view status) {
  constexpr std::string_view key = "Cpus_allowed_list:";
  auto const at = status.find(key);
  if (at == std::string_view::npos) return {};
  auto line = status.substr(at + key.size());
  line = line.substr(0, line.find('\n'));
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  return parse_cpu_list(line);
}

/// Pure: the CPUs in both lists.
inline cpu_list common_cpus(cpu_list const& a, cpu_list const& b) {
  cpu_list out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

/// The CPUs the process that started this one may use (mpirun's daemon, srun's step, a shell),
/// before any per-rank binding: empty when it cannot be read.
inline cpu_list launcher_cpus() {
#if defined(__linux__)
  std::ifstream in("/proc/" + std::to_string(::getppid()) + "/status");
  std::string status((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return allowed_cpus_in_status(status);
#else
  return {};
#endif
}

/// The CPUs of this node the job may use: the cgroup's cpuset (containers, Slurm), else the
/// online CPUs, else first_cpus(); narrowed to the launcher's CPUs (a job started under
/// `taskset`/`numactl`, or one node's share of a machine) so that no thread leaves what the job
/// was given.
inline cpu_list node_cpus() {
  cpu_list base;
  for (char const* path : {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"}) {
    std::ifstream in(path);
    std::string text;
    if (in && std::getline(in, text))
      if (base = parse_cpu_list(text); !base.empty()) break;
  }
  if (base.empty()) base = first_cpus();
  auto const given = common_cpus(base, launcher_cpus());
  return given.empty() ? base : given;
}

/// Binds the calling thread to `cpus` (Linux; best effort: nothing happens when `cpus` is empty
/// or the kernel refuses).
inline void run_this_thread_on(cpu_list const& cpus) {
#if defined(__linux__)
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
#else
  (void)cpus;
#endif
}

/// Moves the calling thread to the node's spare CPUs, if there are any: what every cohort
/// background thread does first (detail::begin_background_thread).
inline void move_to_spare_cpus() { run_this_thread_on(placement().spare); }

/// The cores this rank's intra-op threads may use and how many ranks of the node share them.
struct rank_cores {
  int cores = 1;
  int sharing_ranks = 1;
};

/// Pure: the one-line warning for a rank whose binding costs it training threads (empty when it
/// does not): bound to `mine`, `sharing` ranks on those cores, `local_ranks` ranks of the job on
/// a node of `node` CPUs, given `threads` intra-op threads. It warns when the threads outnumber
/// the cores it may run on, or when the binding leaves it fewer cores than it would have unbound
/// (`mpirun -np 1`: Open MPI binds one or two ranks to a core each, and the other cores idle).
inline std::string binding_warning(int rank, cpu_list const& mine, cpu_list const& node, int sharing, int local_ranks,
                                   int threads) {
  if (mine.empty() || node.empty() || mine.size() >= node.size()) return {};  // not bound, or bound to the whole node
  auto const bound = static_cast<int>(mine.size());
  auto const all = static_cast<int>(node.size());
  auto cores = [](int n) { return std::to_string(n) + (n == 1 ? " core" : " cores"); };
  std::string const where = "cohort: warning: rank " + std::to_string(rank) + " is bound to " + std::to_string(bound) +
                            " of this node's " + cores(all);
  if (threads > bound)
    return where + ", fewer than its " + std::to_string(threads) +
           " intra-op threads, which then take turns: give it more cores (mpirun --bind-to none, or "
           "--map-by ppr:<ranks>:node:pe=<cores>) or fewer threads (scaling .threads_per_worker)";
  auto const bound_share = std::max(1, bound / std::max(1, sharing));
  auto const unbound_share = std::max(1, all / std::max(1, local_ranks));
  if (bound_share < unbound_share)
    return where + " (mpirun binds each rank to a core when it starts two or fewer), so it trains on " + cores(bound_share) +
           " where unbound it would have " + std::to_string(unbound_share) +
           ": launch with mpirun --bind-to none (or --map-by ppr:<ranks>:node:pe=<cores>)";
  return {};
}

/// This rank's binding and the local ranks bound to any of its cores (unbound ranks: the
/// node's cores and all of them); `node_cores` and `local_ranks` when the placement is not known.
inline rank_cores cores_of_this_rank(int node_cores, int local_ranks) {
  auto const& p = placement();
  if (!p.known) return {node_cores, local_ranks};
  return {static_cast<int>(p.mine.size()), std::max(1, ranks_sharing(p.mine, p.ranks))};
}

/// The job's ranks on this node per CPU the node gives the job (its cpuset, the launcher's
/// CPUs); `local_ranks` over `node_cores` when the placement is not known.
inline double ranks_per_core(int node_cores, int local_ranks) {
  auto const& p = placement();
  if (!p.known || p.node.empty()) return static_cast<double>(local_ranks) / std::max(1, node_cores);
  return static_cast<double>(p.ranks.size()) / static_cast<double>(p.node.size());
}

}  // namespace cohort::scaling
