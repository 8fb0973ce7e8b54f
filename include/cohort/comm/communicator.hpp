#pragma once
/// \file
/// The communicator concept: the collectives a trainer needs, over raw buffers.
/// Implementations: comm::mpi (CPU, always available) and, with COHORT_WITH_NCCL, the NCCL
/// GPU backend. Nothing here depends on LibTorch.

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace cohort::comm {

/// Element-wise reduction applied by allreduce. `avg` is the sum divided by the communicator's
/// size in one operation (NCCL's ncclAvg; comm::mpi fuses the division into its reduction), for
/// float, double, bfloat16 and float16 only: a communicator throws cohort::error for it on integer buffers.
enum class reduce_op { sum, max, min, avg };

/// A bfloat16 number stored as its 16 bits (the upper half of a float32): the element type of
/// gradient buckets compressed for the all-reduce (model_options::compression). Communicators
/// reduce it in float32 and round each result to bfloat16, as NCCL does.
struct bfloat16 {
  std::uint16_t bits = 0;

  /// `f` rounded to the nearest bfloat16 (ties to even); a NaN stays a NaN. Without branches,
  /// so that loops over buffers vectorise.
  static bfloat16 from_float(float f) {
    auto const u = std::bit_cast<std::uint32_t>(f);
    auto const nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    auto const quiet_nan = (u >> 16) | 0x40u;
    return {static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest)};
  }
  /// The exact float32 value.
  float to_float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
  friend bool operator==(bfloat16, bfloat16) = default;
};

/// An IEEE 754 binary16 number (float16) stored as its 16 bits: the element type of gradient
/// buckets compressed to float16 for the all-reduce. Communicators reduce it in float32 and round
/// each result to float16, as NCCL does.
struct float16 {
  std::uint16_t bits = 0;

  /// `f` rounded to the nearest float16 (ties to even; subnormals kept; beyond the largest
  /// float16, 65504, rounded to infinity); a NaN stays a NaN. Each case computed and one chosen,
  /// without branches, so that loops over buffers vectorise.
  static float16 from_float(float f) {
    auto const w = std::bit_cast<std::uint32_t>(f);
    auto const sign = (w >> 16) & 0x8000u;
    auto const u = w & 0x7fffffffu;
    auto const huge = pick(u > 0x7f800000u, 0x7e00u, 0x7c00u);  // 65536 and beyond, infinities, NaNs
    // below 2^-14: a float16 subnormal or zero; float addition of 0.5 aligns 2^-24 to the last bit and rounds it
    auto const tiny = std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + 0.5f) - 0x3f000000u;
    auto const normal = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;  // exponent rebiased (127 -> 15), rounded to even
    return {static_cast<std::uint16_t>(sign | pick(u >= 0x47800000u, huge, pick(u < 0x38800000u, tiny, normal)))};
  }
  /// The exact float32 value.
  float to_float() const {
    std::uint32_t const sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    std::uint32_t const exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    std::uint32_t const special = 0x7f800000u | (mantissa << 13);  // infinities, NaNs
    // zero or subnormal: mantissa * 2^-24, exact in float32
    std::uint32_t const tiny = std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mantissa)) * 0x1p-24f);
    std::uint32_t const normal = ((exponent + 112) << 23) | (mantissa << 13);
    return std::bit_cast<float>(sign | pick(exponent == 0x1f, special, pick(exponent == 0, tiny, normal)));
  }
  friend bool operator==(float16, float16) = default;

 private:
  /// `c ? a : b` as masks, which GCC vectorises where it turns a conditional into a branch.
  static std::uint32_t pick(bool c, std::uint32_t a, std::uint32_t b) {
    std::uint32_t const m = 0u - static_cast<std::uint32_t>(c);
    return (a & m) | (b & ~m);
  }
};

/// The element types every communicator reduces, listed once: X(type) for each. The `reducible`
/// concept and comm::any's virtual functions are made from it; each backend's type map
/// (mpi_type, nccl_type) asserts that it covers every type here.
#define COHORT_REDUCIBLE_TYPES(X) \
  X(float) X(double) X(bfloat16) X(float16) X(std::int32_t) X(std::int64_t) X(std::uint8_t) X(std::uint64_t)

#define COHORT_SAME_AS_OR(type) std::same_as<T, type> ||
/// Element types every communicator reduces (COHORT_REDUCIBLE_TYPES).
template <class T>
concept reducible = COHORT_REDUCIBLE_TYPES(COHORT_SAME_AS_OR) false;
#undef COHORT_SAME_AS_OR

/// A handle to a collective in flight. `wait()` blocks until it completes; `test()` makes
/// progress and says whether it has completed.
template <class R>
concept request = std::movable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

/// What a trainer needs from a communicator. Every collective must be entered by every rank
/// of the communicator in the same order; buffers are raw and owned by the caller.
///  - allreduce / iallreduce: in place, element-wise `op` over all ranks.
///  - broadcast: `bytes` from `root` to every rank.
///  - allgather: `bytes` from each rank into `recv` (size() * bytes), in rank order.
///  - split: a new communicator per `color`, ranks ordered by `key` (MPI_Comm_split semantics).
template <class C>
concept communicator =
    std::movable<C> &&
    requires(C& c, C const& cc, float* f, double* d, bfloat16* h, float16* h16, std::int32_t* i32, std::int64_t* i,
             std::uint8_t* u8, std::uint64_t* u64, std::byte* b, std::byte const* cb, std::size_t n, int r) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      c.allreduce(f, n, reduce_op::sum);
      c.allreduce(d, n, reduce_op::sum);
      c.allreduce(h, n, reduce_op::sum);
      c.allreduce(h16, n, reduce_op::sum);
      c.allreduce(i32, n, reduce_op::sum);
      c.allreduce(i, n, reduce_op::max);
      c.allreduce(u8, n, reduce_op::min);
      c.allreduce(u64, n, reduce_op::sum);
      { c.iallreduce(f, n, reduce_op::sum) } -> request;
      c.broadcast(b, n, r);
      c.allgather(cb, n, b);
      c.barrier();
      { cc.split(r, r) } -> std::same_as<C>;
    };

}  // namespace cohort::comm
