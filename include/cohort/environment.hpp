#pragma once
/// \file
/// cohort::environment: MPI up for the lifetime of an object, down at scope exit.

#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#ifdef __GLIBC__  // defined by the C library's headers (<cstdlib> above), not by the compiler
#include <malloc.h>
#endif

#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/error.hpp"
#include "cohort/scaling/cpu_set.hpp"

namespace cohort {

namespace detail {

/// Ranks of the whole job on this node, found when cohort initialised MPI (0: not known, MPI was
/// initialised by someone else). Intra-op threads are shared among them, whatever communicator
/// a trainer runs on (the tuner's trial groups split a node's ranks into several trainers).
inline int& job_ranks_on_node() {
  static int n = 0;
  return n;
}

/// This rank's index among job_ranks_on_node() (valid when that is not 0): what scaling::cuda
/// picks its GPU by, so that trial groups sharing a node get disjoint GPUs.
inline int& job_local_rank() {
  static int r = 0;
  return r;
}

/// Open MPI settings cohort relies on, set before MPI starts where the job does not set them
/// itself (an OMPI_MCA_ variable; `mpirun --mca NAME VALUE` sets the same variable):
/// - btl_tcp_links 2: two TCP connections between each pair of ranks on different hosts, over
///   which Open MPI stripes large messages. Between 2 hosts on a 1 Gbit/s link, cohort's gradient
///   synchronisation of 4 MiB took 48-54 ms over one connection and 35-48 ms over two (the link's
///   bound: 34 ms), of 16 MiB 224-248 ms and 147-219 ms (bound: 134 ms); four were no faster,
///   eight hung Open MPI 4.1 (docs/benchmarks.md, "Across hosts"). Inside one node Open MPI uses
///   shared memory and this does not apply.
/// - pml ^cm,ucx, on a node without a fabric device (`fabric` false: no InfiniBand, Omni-Path, EFA
///   or Slingshot, see node_has_fabric) and where the job names neither a PML nor an MTL: the cm
///   PML drives such fabrics through libfabric or PSM2 and the ucx PML through UCX; with no device
///   to drive neither is chosen, yet probing them took 0.20 s of MPI_Init's 0.24 s
///   (docs/benchmarks.md, "One rank against the plain C++ loop, and where launch goes"). Open MPI
///   then picks ob1, as it would have. ucx is named too because the variable replaces the system
///   file's `pml` (Debian's excludes ucx, whose start crashes a ThreadSanitizer build).
inline std::vector<std::pair<std::string, std::string>> transport_defaults(bool fabric, bool job_names_pml) {
  std::vector<std::pair<std::string, std::string>> out{{"OMPI_MCA_btl_tcp_links", "2"}};
  if (!fabric && !job_names_pml) out.emplace_back("OMPI_MCA_pml", "^cm,ucx");
  return out;
}

/// Whether this node has a device of a fabric that Open MPI drives outside TCP and shared memory:
/// an RDMA device (/sys/class/infiniband: InfiniBand, RoCE, Omni-Path, AWS EFA), HPE Slingshot
/// (/sys/class/cxi) or an Omni-Path PSM2 device (/dev/hfi1_0).
inline bool node_has_fabric() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (char const* dir : {"/sys/class/infiniband", "/sys/class/cxi"})
    if (fs::is_directory(dir, ec) && !fs::is_empty(dir, ec)) return true;
  return fs::exists("/dev/hfi1_0", ec);
}

/// Sets transport_defaults in this process's environment, leaving any the job set alone.
inline void set_transport_defaults() {
  bool const job_names_pml = std::getenv("OMPI_MCA_pml") != nullptr || std::getenv("OMPI_MCA_mtl") != nullptr;
  for (auto const& [name, value] : transport_defaults(node_has_fabric(), job_names_pml))
    ::setenv(name.c_str(), value.c_str(), 0);
}

/// glibc's heap settings cohort starts a process with (set_heap_defaults): blocks under
/// `mmap_threshold_bytes` come from the heap, and the heap gives memory back to the system only
/// when more than `trim_threshold_bytes` are free at its top. Left alone, glibc starts both at
/// 128 KiB and raises them only when a block it mapped is freed (to that block's size, and twice
/// that), so whether a step's tensors (the reference CNN's activations: 6.4 MB each at batch 64)
/// stay in the heap depended on what the program had freed before; where they did not, they went
/// to the system and faulted in again every step (3.9 GB a one-rank epoch), and the Fashion-MNIST
/// example ran 1.27x as long at 2 ranks (docs/benchmarks.md, "The example against an earlier
/// build"). These are the values glibc's own rule reaches after freeing a 32 MiB block (the largest
/// mmap threshold it takes), set from the start. Blocks of 32 MiB and more are still mapped for
/// each use; a program with many of them is better served by jemalloc or tcmalloc (LD_PRELOAD),
/// which these settings do not touch.
struct heap_settings {
  int mmap_threshold_bytes = 32 << 20;
  int trim_threshold_bytes = 64 << 20;
};

/// Whether the job sets glibc's heap itself: a glibc.malloc tunable in `glibc_tunables` (the
/// GLIBC_TUNABLES variable, null when unset), or `malloc_variable_set` (one of glibc's
/// MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_). Then cohort
/// sets none of heap_settings: a value set by glibc's own means wins. Pure.
inline bool job_sets_heap(char const* glibc_tunables, bool malloc_variable_set) {
  return malloc_variable_set ||
         (glibc_tunables != nullptr && std::string_view(glibc_tunables).find("glibc.malloc.") != std::string_view::npos);
}

/// job_sets_heap for this process's environment variables.
inline bool job_sets_heap() {
  bool variable = false;
  for (char const* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    variable = variable || std::getenv(name) != nullptr;
  return job_sets_heap(std::getenv("GLIBC_TUNABLES"), variable);
}

/// Sets heap_settings with mallopt where the job set none of its own (job_sets_heap); nothing
/// where the C library is not glibc.
inline void set_heap_defaults() {
#ifdef __GLIBC__
  if (job_sets_heap()) return;
  heap_settings const s;
  (void)mallopt(M_MMAP_THRESHOLD, s.mmap_threshold_bytes);
  (void)mallopt(M_TRIM_THRESHOLD, s.trim_threshold_bytes);
#endif
}

/// Where the ranks of `node` (one node's ranks, a collective over it) are bound: every rank's
/// binding in one allgather of 128-byte bitmaps, and the spare cores none of them is bound to.
inline scaling::cpu_placement find_cpu_placement(MPI_Comm node) {
  int ranks = 0;
  MPI_Comm_size(node, &ranks);
  scaling::cpu_placement p;
  p.node = scaling::node_cpus();
  p.mine = scaling::this_thread_cpus();
  auto const mine = scaling::to_bitmap(p.mine);
  std::vector<scaling::cpu_bitmap> all(static_cast<std::size_t>(ranks));
  comm::detail::check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(),
                                        static_cast<int>(mine.size()), MPI_BYTE, node),
                          "MPI_Allgather");
  for (auto const& b : all) p.ranks.push_back(scaling::from_bitmap(b));
  p.spare = scaling::spare_cpus(p.node, p.ranks);
  p.known = true;
  return p;
}

/// Per world rank of `world` ranks: whether it runs on another node than the ranks of `node`
/// (this node's communicator). Local: a group translation.
inline std::vector<bool> world_ranks_off_node(MPI_Comm node, int world) {
  int ranks = 0;
  MPI_Comm_size(node, &ranks);
  std::vector<int> local(static_cast<std::size_t>(ranks));
  std::iota(local.begin(), local.end(), 0);
  std::vector<bool> off(static_cast<std::size_t>(world), true);
  for (int w : comm::detail::world_ranks_of(node, local))
    if (w >= 0 && w < world) off[static_cast<std::size_t>(w)] = false;
  return off;
}

/// Initialises MPI with MPI_THREAD_MULTIPLE (the tuner's coordinator thread on rank 0 talks to the
/// trial groups while rank 0's own trial trains) unless it is already up, after setting the
/// process's heap and transport defaults (set_heap_defaults, set_transport_defaults). Returns true
/// when this call initialised it.
inline bool ensure_mpi(int* argc, char*** argv) {
  int up = 0;
  MPI_Initialized(&up);
  if (up) return false;
  set_heap_defaults();
  set_transport_defaults();
  int provided = 0;
  comm::detail::check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &job_ranks_on_node());
  MPI_Comm_rank(node, &job_local_rank());
  scaling::placement() = find_cpu_placement(node);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Transfers to other nodes go in pieces where every node talks over TCP (ring.hpp,
  // remote_piece_bytes): agreed by all ranks, since both ends of a transfer must cut it alike.
  int tcp_everywhere = node_has_fabric() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &tcp_everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (tcp_everywhere == 1) comm::detail::world_rank_on_other_node() = world_ranks_off_node(node, world);
  MPI_Comm_free(&node);
  comm::detail::spin_limit_us() =
      comm::detail::spin_limit(world, job_ranks_on_node(), static_cast<int>(scaling::placement().node.size())).count();
  if (provided >= MPI_THREAD_MULTIPLE) comm::detail::job_alarm().start();  // tested from any waiting thread
  return true;
}

/// MPI down, after the alarm's receive is withdrawn; nothing when MPI is already finalised.
inline void finalize_mpi() {
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  comm::detail::job_alarm().stop();
  MPI_Finalize();
}

/// For `trainer{fn}.fit(cfg)` without an environment: MPI is initialised on first use and
/// finalised when the program exits.
inline void ensure_mpi_for_program() {
  struct finalizer {
    bool owns = ensure_mpi(nullptr, nullptr);
    ~finalizer() {
      if (owns) finalize_mpi();
    }
  };
  static finalizer f;
}

}  // namespace detail

/// Brings MPI up (MPI_THREAD_MULTIPLE) and takes it down at scope exit. Construct one at the
/// top of main, on every rank, before any cohort call:
/// `cohort::environment env{argc, argv};`. If MPI is already initialised, it is left alone.
/// Before MPI starts, it sets the process's heap (detail::heap_settings) and Open MPI's transport
/// (detail::transport_defaults) where the job sets none of its own.
class environment {
 public:
  environment() : owns_(detail::ensure_mpi(nullptr, nullptr)) {}
  environment(int& argc, char**& argv) : owns_(detail::ensure_mpi(&argc, &argv)) {}
  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;
  ~environment() {
    if (owns_) detail::finalize_mpi();
  }

  /// The world communicator (MPI_COMM_WORLD, not owned).
  comm::mpi world() const { return comm::mpi::world(); }

 private:
  bool owns_;
};

}  // namespace cohort
