#include <cohort/comm/any.hpp>
#include <cohort/comm/collectives.hpp>
#include <cohort/comm/mpi.hpp>
#include <cohort/environment.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <string>
#include <vector>

#include "../catch.hpp"

using cohort::comm::reduce_op;

TEST_CASE("mpi allreduce sums, maxes and mins over every rank", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  int const n = c.size(), r = c.rank();
  std::vector<double> v{double(r), 1.0};
  c.allreduce(v.data(), v.size(), reduce_op::sum);
  CHECK(v[0] == Approx(n * (n - 1) / 2.0));
  CHECK(v[1] == Approx(double(n)));
  std::int64_t m[2] = {r, -r};
  c.allreduce(m, 2, reduce_op::max);
  CHECK(m[0] == n - 1);
  CHECK(m[1] == 0);
  std::int32_t lo = r + 5;
  c.allreduce(&lo, 1, reduce_op::min);
  CHECK(lo == 5);
}

TEST_CASE("mpi iallreduce completes after wait and test", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  std::vector<float> v(1000, 1.0f);
  auto req = c.iallreduce(v.data(), v.size(), reduce_op::sum);
  while (!req.test()) {
  }
  CHECK(v[999] == float(c.size()));
  auto again = c.iallreduce(v.data(), v.size(), reduce_op::sum);
  again.wait();
  CHECK(v[0] == float(c.size() * c.size()));
}

TEST_CASE("mpi allreduce avg averages in place, identically on every rank, below and above the ring size", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  int const n = c.size(), r = c.rank();
  // 100 floats: MPI_Allreduce and a scaling pass; the others go round the ring, in segments
  // that do not divide evenly (+5, and a count prime to every rank count).
  for (std::size_t count : {std::size_t{100}, std::size_t(8192 * n + 5), std::size_t{100003}}) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = float((r + 1) * int(i % 13));
    c.allreduce(v.data(), count, reduce_op::avg);
    bool close = true;
    for (std::size_t i = 0; i < count; ++i) close = close && std::abs(v[i] - float(n + 1) / 2 * float(i % 13)) <= 1e-5f * float(i % 13 + 1);
    CHECK(close);
    auto lo = v, hi = v;  // bitwise the same everywhere: the minimum over ranks equals the maximum
    c.allreduce(lo.data(), count, reduce_op::min);
    c.allreduce(hi.data(), count, reduce_op::max);
    CHECK(lo == hi);
  }
  // 100003 floats give each ring step over 64 KiB each way up to 6 ranks: they tell the link's rate.
  if (n > 1 && n <= 6) CHECK(cohort::comm::detail::link_rate().load() > 0);
  std::vector<double> d(50000, double(r));
  c.allreduce(d.data(), d.size(), reduce_op::avg);
  CHECK(d[49999] == Approx((n - 1) / 2.0));
  auto req = c.iallreduce(d.data(), d.size(), reduce_op::avg);
  req.wait();
  CHECK(d[0] == Approx((n - 1) / 2.0));
  std::int32_t i = r;
  CHECK_THROWS_WITH(c.allreduce(&i, 1, reduce_op::avg), contains_text("needs float, double"));
}

TEST_CASE("mpi broadcast and allgather move bytes in rank order", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  std::int64_t x = c.rank() == 0 ? 42 : -1;
  c.broadcast(reinterpret_cast<std::byte*>(&x), sizeof x, 0);
  CHECK(x == 42);
  auto all = cohort::comm::allgather_value(c, c.rank() * 10);
  REQUIRE(all.size() == static_cast<std::size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == r * 10);
}

TEST_CASE("strings of different lengths are gathered and broadcast whole", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  auto all = cohort::comm::allgather_strings(c, std::string(static_cast<std::size_t>(c.rank()), 'x'));
  for (int r = 0; r < c.size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == std::string(static_cast<std::size_t>(r), 'x'));
  CHECK(cohort::comm::broadcast_string(c, c.rank() == 0 ? "from zero" : "") == "from zero");
}

TEST_CASE("split groups ranks by color and orders them by key", "[comm][mpi]") {
  auto c = cohort::comm::mpi::world();
  auto half = c.split(c.rank() % 2, -c.rank());
  int const expect = (c.size() - c.rank() % 2 + 1) / 2;
  CHECK(half.size() == expect);
  int sum = 1;
  half.allreduce(&sum, 1, reduce_op::sum);
  CHECK(sum == expect);
  // key = -rank: the highest world rank of each color is rank 0 of its group
  auto ranks = cohort::comm::allgather_value(half, c.rank());
  for (std::size_t i = 1; i < ranks.size(); ++i) CHECK(ranks[i - 1] > ranks[i]);
}

TEST_CASE("any erases the communicator type and still reduces in place", "[comm][mpi]") {
  auto world = cohort::comm::mpi::world();
  auto ref = cohort::comm::any::ref(world);
  auto owned = cohort::comm::any(world.split(0, world.rank()));
  double v = 1.0;
  owned.allreduce(&v, 1, reduce_op::sum);
  CHECK(v == double(world.size()));
  float f[3] = {1, 2, 3};
  auto req = ref.iallreduce(f, 3, reduce_op::sum);
  cohort::comm::any_request moved = std::move(req);
  moved.wait();
  CHECK(f[2] == 3.0f * float(world.size()));
  auto sub = owned.split(world.rank() % 2, world.rank());
  CHECK(sub.size() == (world.size() - world.rank() % 2 + 1) / 2);
  // target: the communicator inside, by type (referred to or owned), null for another type
  CHECK(ref.target<cohort::comm::mpi>() == &world);
  REQUIRE(owned.target<cohort::comm::mpi>() != nullptr);
  CHECK(owned.target<cohort::comm::mpi>()->size() == world.size());
  CHECK(ref.target<cohort::comm::any>() == nullptr);
}

TEST_CASE("bfloat16 rounds to nearest even", "[comm]") {
  using cohort::comm::bfloat16;
  CHECK(bfloat16::from_float(1.0f).to_float() == 1.0f);
  CHECK(bfloat16::from_float(1.0f + 1.0f / 256).to_float() == 1.0f);                  // a tie: to even (down)
  CHECK(bfloat16::from_float(1.0f + 3.0f / 256).to_float() == 1.0f + 1.0f / 64);      // a tie: to even (up)
  CHECK(bfloat16::from_float(1.0f + 1.0f / 128 + 1.0f / 1024).to_float() == 1.0f + 1.0f / 128);
  CHECK(std::isnan(bfloat16::from_float(std::nanf("")).to_float()));
}

TEST_CASE("float16 converts as IEEE binary16: nearest even, subnormals, overflow to infinity", "[comm]") {
  using cohort::comm::float16;
  CHECK(float16::from_float(1.0f).bits == 0x3c00);
  CHECK(float16::from_float(-2.0f).bits == 0xc000);
  CHECK(float16::from_float(65504.0f).bits == 0x7bff);   // the largest
  CHECK(float16::from_float(65519.0f).bits == 0x7bff);   // below the midpoint to 65536: down
  CHECK(float16::from_float(65520.0f).bits == 0x7c00);   // the midpoint, odd below: infinity
  CHECK(float16::from_float(1e9f).bits == 0x7c00);
  CHECK(float16::from_float(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(float16::from_float(1.0f + 1.0f / 2048).bits == 0x3c00);      // a tie: to even (down)
  CHECK(float16::from_float(1.0f + 3.0f / 2048).bits == 0x3c02);      // a tie: to even (up)
  CHECK(float16::from_float(0x1p-24f).bits == 0x0001);                // the smallest subnormal
  CHECK(float16::from_float(0x1p-25f).bits == 0x0000);                // a tie: to even (zero)
  CHECK(float16::from_float(0x3p-25f).bits == 0x0002);                // a tie: to even (up)
  CHECK(float16::from_float(0x1p-14f - 0x1p-26f).bits == 0x0400);     // rounds up into the normals
  CHECK(float16::from_float(-0.0f).bits == 0x8000);
  CHECK(std::isnan(float16::from_float(std::nanf("")).to_float()));
  // Every float16 widens exactly and converts back to itself.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    float16 h{static_cast<std::uint16_t>(b)};
    float const f = h.to_float();
    if (std::isnan(f)) continue;
    if (float16::from_float(f) != h) FAIL("float16 bits " << b << " do not round-trip");
  }
  CHECK(float16{0x0001}.to_float() == 0x1p-24f);
  CHECK(float16{0x7bff}.to_float() == 65504.0f);
  CHECK(std::isinf(float16{0x7c00}.to_float()));
#if defined(__FLT16_MAX__)
  // Against the compiler's own _Float16 (IEEE rounding) on a sweep of float bit patterns.
  for (std::uint64_t b = 0; b < 0x100000000u; b += 4093) {
    float const f = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (std::isnan(f)) continue;
    auto const expect = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    if (float16::from_float(f).bits != expect) FAIL("float16::from_float(" << f << ") differs from _Float16");
  }
#endif
}

TEMPLATE_TEST_CASE("mpi reduces bfloat16 and float16 in float32, identically on every rank", "[comm][mpi]",
                   cohort::comm::bfloat16, cohort::comm::float16) {
  using half = TestType;
  auto c = cohort::comm::mpi::world();
  int const n = c.size(), r = c.rank();
  std::vector<half> v{half::from_float(float(r)), half::from_float(0.5f), half::from_float(-float(r))};
  c.allreduce(v.data(), v.size(), reduce_op::sum);  // small integers: exact in both
  CHECK(v[0].to_float() == float(n * (n - 1) / 2));
  CHECK(v[1].to_float() == 0.5f * float(n));
  std::vector<half> m{half::from_float(float(r)), half::from_float(-float(r))};
  c.allreduce(m.data(), m.size(), reduce_op::max);
  CHECK(m[0].to_float() == float(n - 1));
  CHECK(m[1].to_float() == 0.0f);
  std::vector<half> a{half::from_float(2.0f * float(r))};
  c.allreduce(a.data(), a.size(), reduce_op::avg);
  CHECK(a[0].to_float() == float(n - 1));
  auto req = c.iallreduce(a.data(), a.size(), reduce_op::avg);
  req.wait();
  CHECK(a[0].to_float() == float(n - 1));
  // Every rank ends with the same bits, also for values that round.
  std::vector<half> x;
  for (int i = 0; i < 1000; ++i) x.push_back(half::from_float(std::sin(float(i + 7 * r))));
  c.allreduce(x.data(), x.size(), reduce_op::sum);
  std::vector<std::uint64_t> bits(x.size()), lo(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = lo[i] = x[i].bits;
  c.allreduce(bits.data(), bits.size(), reduce_op::max);
  CHECK(bits == lo);
}

TEMPLATE_TEST_CASE("the ring sums bfloat16 and float16 as the user operation does, identically on every rank",
                   "[comm][mpi]", cohort::comm::bfloat16, cohort::comm::float16) {
  using half = TestType;
  int r = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  float const ulp = std::is_same_v<half, cohort::comm::bfloat16> ? 0x1p-7f : 0x1p-10f;  // at 1
  std::size_t const count = std::size_t(20000) * static_cast<std::size_t>(n) + 7;  // unequal segments
  std::vector<half> exact(count), rounding(count);
  for (std::size_t i = 0; i < count; ++i) {
    exact[i] = half::from_float(float(i % 5 + static_cast<std::size_t>(r)));
    rounding[i] = half::from_float(std::sin(float(i) * 0.37f + float(r)));
  }
  auto by_user_op = rounding;
  std::vector<std::byte> scratch;
  cohort::comm::collective const what{"allreduce", "world", 1, 0};
  cohort::comm::detail::ring_allreduce(exact.data(), count, reduce_op::sum, MPI_COMM_WORLD, r, n, scratch, what, 0);
  bool all_exact = true;  // small integers: exact in both types
  for (std::size_t i = 0; i < count; ++i) all_exact = all_exact && exact[i].to_float() == float(n * int(i % 5) + n * (n - 1) / 2);
  CHECK(all_exact);
  cohort::comm::detail::ring_allreduce(rounding.data(), count, reduce_op::sum, MPI_COMM_WORLD, r, n, scratch, what, 0);
  MPI_Allreduce(MPI_IN_PLACE, by_user_op.data(), static_cast<int>(count), MPI_UINT16_T,
                cohort::comm::detail::mpi_op_for<half>(reduce_op::sum), MPI_COMM_WORLD);
  // In float32, one rounding per addition: at 2 ranks one addition, the same in any order; with
  // more the orders differ, each within a rounding per addition of a sum of at most n.
  bool close = true;
  for (std::size_t i = 0; i < count; ++i)
    close = close && (n <= 2 ? rounding[i] == by_user_op[i]
                             : std::abs(rounding[i].to_float() - by_user_op[i].to_float()) <= float(n * n) * ulp);
  CHECK(close);
  std::vector<std::uint64_t> lo(count), hi(count);
  for (std::size_t i = 0; i < count; ++i) lo[i] = hi[i] = rounding[i].bits;
  MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(count), MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(count), MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
}

TEST_CASE("the ring takes float and double averages, and half-float sums and averages only across nodes", "[comm][pure]") {
  using cohort::comm::bfloat16;
  using cohort::comm::float16;
  using cohort::comm::detail::ring_reduces;
  for (bool across : {false, true}) {
    CHECK(ring_reduces<float>(reduce_op::avg, across));
    CHECK(ring_reduces<double>(reduce_op::avg, across));
    CHECK(ring_reduces<bfloat16>(reduce_op::avg, across) == across);
    CHECK_FALSE(ring_reduces<float>(reduce_op::sum, across));
    CHECK_FALSE(ring_reduces<bfloat16>(reduce_op::max, across));
  }
  CHECK(ring_reduces<bfloat16>(reduce_op::sum, true));
  CHECK(ring_reduces<float16>(reduce_op::sum, true));
  CHECK_FALSE(ring_reduces<bfloat16>(reduce_op::sum, false));  // one node: Open MPI's user operation is as fast
  CHECK_FALSE(ring_reduces<float16>(reduce_op::avg, false));
  CHECK_FALSE(ring_reduces<std::int64_t>(reduce_op::sum, true));
}

TEST_CASE("Open MPI runs with cohort's transport defaults unless the job set its own", "[comm][mpi]") {
  // cohort::environment (the tests' main) set them before MPI_Init; a job's own value wins.
  bool const job_names_pml =
      (std::getenv("OMPI_MCA_pml") != nullptr && std::string_view(std::getenv("OMPI_MCA_pml")) != "^cm,ucx") ||
      std::getenv("OMPI_MCA_mtl") != nullptr;
  for (auto const& [name, value] : cohort::detail::transport_defaults(cohort::detail::node_has_fabric(), job_names_pml)) {
    char const* set = std::getenv(name.c_str());
    REQUIRE(set != nullptr);
    std::string const cvar = name.substr(std::string_view("OMPI_MCA_").size());
    // What Open MPI itself uses, through the MPI tool interface.
    int level = 0, provided = 0;
    MPI_Query_thread(&level);  // Open MPI lowers MPI's own level to what the tool interface asks for
    REQUIRE(MPI_T_init_thread(level, &provided) == MPI_SUCCESS);
    int index = -1;
    if (MPI_T_cvar_get_index(cvar.c_str(), &index) != MPI_SUCCESS) {
      MPI_T_finalize();
      WARN("this MPI has no control variable " << cvar << ": not Open MPI with its TCP transport");
      continue;
    }
    MPI_T_cvar_handle handle;
    int count = 0;
    REQUIRE(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS);
    std::string used;
    if (cvar == "pml") {  // a string: the PMLs Open MPI may choose from
      std::vector<char> text(static_cast<std::size_t>(std::max(count, 1)) + 1, '\0');
      REQUIRE(MPI_T_cvar_read(handle, text.data()) == MPI_SUCCESS);
      used = text.data();
    } else {
      int number = 0;
      REQUIRE(MPI_T_cvar_read(handle, &number) == MPI_SUCCESS);
      used = std::to_string(number);
    }
    MPI_T_cvar_handle_free(&handle);
    MPI_T_finalize();
    int after = 0;
    MPI_Query_thread(&after);
    REQUIRE(after == level);
    CHECK(used == set);
    if (std::string_view(set) == value) CHECK(used == value);
  }
}

TEST_CASE("the cm and ucx PMLs are left out only on a node without a fabric, where the job names no PML or MTL", "[comm][pure]") {
  using cohort::detail::transport_defaults;
  auto has_pml = [](auto const& settings) {
    return std::any_of(settings.begin(), settings.end(), [](auto const& kv) { return kv.first == "OMPI_MCA_pml"; });
  };
  auto const plain = transport_defaults(false, false);
  REQUIRE(plain.size() == 2);
  CHECK(plain[0] == std::pair<std::string, std::string>{"OMPI_MCA_btl_tcp_links", "2"});
  CHECK(plain[1] == std::pair<std::string, std::string>{"OMPI_MCA_pml", "^cm,ucx"});
  CHECK_FALSE(has_pml(transport_defaults(true, false)));  // InfiniBand, Omni-Path, EFA, Slingshot: Open MPI chooses
  CHECK_FALSE(has_pml(transport_defaults(false, true)));  // the job's own choice
  CHECK(transport_defaults(true, true).size() == 1);
}

TEST_CASE("waits spin on one node with a core per rank, and poll early across hosts or with more ranks than cores", "[comm][pure]") {
  // Catches: a wait that sleeps between progress calls on shared memory (a two-rank ring of 1 MiB
  // took twice as long), or one that spins across hosts (it takes the core from the backward
  // pass it overlaps and from the network stack).
  using cohort::comm::detail::spin_limit;
  using std::chrono::microseconds;
  CHECK(spin_limit(2, 2, 2) == microseconds(100'000));  // one node, a core each: up to long_wait
  CHECK(spin_limit(1, 1, 1) == microseconds(100'000));
  CHECK(spin_limit(4, 4, 2) == microseconds(50));  // more ranks than cores
  CHECK(spin_limit(2, 1, 8) == microseconds(50));  // another host holds a rank
  CHECK(spin_limit(8, 4, 16) == microseconds(50));
}

TEST_CASE("a wait polls as often as its link needs: rarely on a slow link, often on a fast one or a short wait", "[comm][pure]") {
  // Catches: a wait across hosts that polls every 20 us on a 200 Mbit/s link (a fifth of the
  // core its backward runs on), one that sleeps long on a fast link (the transfer stalls between
  // polls), and one that sleeps long in a short wait (the ranks' agreement seen done late).
  using cohort::comm::detail::poll_interval_for;
  using std::chrono::microseconds;
  auto const ms = microseconds(1000);
  CHECK(poll_interval_for(0, ms) == microseconds(20));  // rate not known yet: as before
  CHECK(poll_interval_for(25e6, ms) == microseconds(500));  // 200 Mbit/s: 16 KiB take 655 us, capped
  CHECK(poll_interval_for(50e6, ms) == microseconds(327));  // 400 Mbit/s
  CHECK(poll_interval_for(125e6, ms) == microseconds(131));  // 1 Gbit/s
  CHECK(poll_interval_for(1.25e9, ms) == microseconds(20));  // 10 Gbit/s and faster: never under 20 us
  CHECK(poll_interval_for(25e6, microseconds(60)) == microseconds(30));  // a short wait: half of it
  CHECK(poll_interval_for(25e6, microseconds(10)) == microseconds(20));

  using cohort::comm::detail::next_link_rate;
  CHECK(next_link_rate(0, 1 << 20, 0.01) == Approx(104857600.0));  // 1 MiB in 10 ms
  CHECK(next_link_rate(100e6, 1 << 20, 1.0) == Approx(90e6));  // a late peer reads slow: the estimate decays
  CHECK(next_link_rate(100e6, 1 << 20, 0.001) == Approx(1048576000.0));  // a faster sample wins at once
  CHECK(next_link_rate(100e6, 4 << 10, 1.0) == 100e6);  // too small to tell the link's rate
  CHECK(next_link_rate(100e6, 1 << 20, 0.0) == 100e6);
}

TEST_CASE("cohort's MPI start-up sets this job's spin limit from its ranks and cores", "[comm][mpi]") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto const expected = cohort::comm::detail::spin_limit(world, cohort::detail::job_ranks_on_node(),
                                                         static_cast<int>(cohort::scaling::placement().node.size()));
  CHECK(cohort::comm::detail::spin_limit_us().load() == expected.count());
  CHECK(cohort::detail::job_ranks_on_node() == world);  // the tests run on one node
}

TEST_CASE("transfers to another node go in pieces under Open MPI's TCP eager limit, on one node whole", "[comm][pure]") {
  using cohort::comm::detail::piece_elements;
  CHECK(piece_elements(true, sizeof(float)) * sizeof(float) == cohort::comm::detail::remote_piece_bytes);
  CHECK(piece_elements(true, sizeof(double)) * sizeof(double) <= cohort::comm::detail::remote_piece_bytes);
  CHECK(cohort::comm::detail::remote_piece_bytes < std::size_t{64} << 10);  // the eager limit, headers included
  CHECK(piece_elements(false, sizeof(float)) == cohort::comm::detail::max_chunk);
  CHECK(piece_elements(true, std::size_t{1} << 20) == 1);  // never zero
}

TEST_CASE("the ring's average and half-float sum are bitwise the same whatever pieces its transfers go in", "[comm][mpi]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::byte> scratch;
  cohort::comm::collective const what{"allreduce", "world", 1, 0};
  // Segments that the pieces do not divide (a prime count), pieces of a few elements up to larger
  // than a segment, and pieces that differ each way (a rank with one neighbour on another node).
  for (cohort::comm::detail::ring_pieces pieces : {cohort::comm::detail::ring_pieces{1000, 1000},
                                                   cohort::comm::detail::ring_pieces{7, 7},
                                                   cohort::comm::detail::ring_pieces{777, 777},
                                                   cohort::comm::detail::ring_pieces{1 << 20, 1 << 20}}) {
    std::vector<float> whole(20011), pieced;
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = std::sin(float(i) * 0.37f + float(rank));
    pieced = whole;
    cohort::comm::detail::ring_allreduce(whole.data(), whole.size(), cohort::comm::reduce_op::avg, MPI_COMM_WORLD, rank, size, scratch, what, 0);
    cohort::comm::detail::ring_allreduce(pieced.data(), pieced.size(), cohort::comm::reduce_op::avg, MPI_COMM_WORLD, rank, size, scratch, what, 0, pieces);
    CHECK(std::memcmp(whole.data(), pieced.data(), whole.size() * sizeof(float)) == 0);
  }
  // Each way its own size: the right neighbour's receive pieces are this rank's send pieces.
  std::vector<double> a(30011), b;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = double(i % 101) * (rank + 1);
  b = a;
  cohort::comm::detail::ring_allreduce(a.data(), a.size(), cohort::comm::reduce_op::avg, MPI_COMM_WORLD, rank, size, scratch, what, 0);
  std::size_t const mine = 500 + 100 * static_cast<std::size_t>(rank);
  std::size_t const lefts = 500 + 100 * static_cast<std::size_t>((rank + size - 1) % size);
  cohort::comm::detail::ring_allreduce(b.data(), b.size(), cohort::comm::reduce_op::avg, MPI_COMM_WORLD, rank, size, scratch, what, 0,
                                     cohort::comm::detail::ring_pieces{mine, lefts});
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
  // A compressed bucket's sum the same way.
  std::vector<cohort::comm::bfloat16> h(20011), hp;
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = cohort::comm::bfloat16::from_float(std::sin(float(i) * 0.37f + float(rank)));
  hp = h;
  cohort::comm::detail::ring_allreduce(h.data(), h.size(), cohort::comm::reduce_op::sum, MPI_COMM_WORLD, rank, size,
                                       scratch, what, 0);
  cohort::comm::detail::ring_allreduce(hp.data(), hp.size(), cohort::comm::reduce_op::sum, MPI_COMM_WORLD, rank, size,
                                       scratch, what, 0, cohort::comm::detail::ring_pieces{7, 7});
  CHECK(h == hp);
}

TEST_CASE("on one node no rank is on another node, and the world's ring goes whole", "[comm][mpi]") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto const& remote = cohort::comm::detail::world_rank_on_other_node();
  // Set by cohort's MPI start-up where the nodes talk over TCP; with a fabric, no pieces at all.
  REQUIRE(remote.size() == (cohort::detail::node_has_fabric() ? 0u : static_cast<std::size_t>(world)));
  CHECK(std::none_of(remote.begin(), remote.end(), [](bool r) { return r; }));
  auto const c = cohort::comm::mpi::world();
  CHECK_FALSE(c.right_on_other_node());
  CHECK_FALSE(c.left_on_other_node());
  CHECK_FALSE(c.across_nodes());
}
