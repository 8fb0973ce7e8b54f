#pragma once
/// \file
/// What comm::mpi sends and how MPI reduces it: the MPI datatype of each reducible type, the
/// MPI operation of each reduce_op (user operations for bfloat16 and float16, which MPI lacks,
/// reducing in float32 as NCCL does), the chunk size MPI's `int` counts allow, and the check of
/// an MPI call's return code.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cohort/comm/communicator.hpp"
#include "cohort/error.hpp"

namespace cohort::comm::detail {

inline void check_mpi(int code, char const* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw cohort::error(std::string("MPI call ") + what + " failed: " + std::string(text, len));
}

/// The 16-bit floating types MPI has no type for (bfloat16, float16): sent as MPI_UINT16_T,
/// reduced by the user operations of mpi_op_for in float32.
template <class T>
concept half_float = std::same_as<T, bfloat16> || std::same_as<T, float16>;

template <class T>
MPI_Datatype mpi_type() {
  static_assert(reducible<T>, "mpi_type: not one of COHORT_REDUCIBLE_TYPES");
  if constexpr (std::same_as<T, float>) return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>) return MPI_DOUBLE;
  else if constexpr (half_float<T>) return MPI_UINT16_T;  // reduced by the user operations of mpi_op_for
  else if constexpr (std::same_as<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::same_as<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::same_as<T, std::uint8_t>) return MPI_UINT8_T;
  else {
    static_assert(std::same_as<T, std::uint64_t>, "mpi_type: a type of COHORT_REDUCIBLE_TYPES without its MPI type");
    return MPI_UINT64_T;
  }
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

/// An MPI user operation on a half_float type: each pair added (or compared) in float32 and
/// rounded back, as NCCL reduces bfloat16 and float16.
template <half_float T, reduce_op Op>
void half_float_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  auto const* a = static_cast<T const*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    float const x = a[i].to_float(), y = b[i].to_float();
    float const r = Op == reduce_op::max ? std::max(x, y) : Op == reduce_op::min ? std::min(x, y) : x + y;
    b[i] = T::from_float(r);
  }
}

/// The MPI operation for `op` on elements of type T (created once per half_float type).
template <class T>
MPI_Op mpi_op_for(reduce_op op) {
  if constexpr (half_float<T>) {
    auto make = [](MPI_User_function* f) {
      MPI_Op o = MPI_OP_NULL;
      check_mpi(MPI_Op_create(f, 1, &o), "MPI_Op_create");
      return o;
    };
    static MPI_Op const sum = make(&half_float_reduce<T, reduce_op::sum>);
    static MPI_Op const max = make(&half_float_reduce<T, reduce_op::max>);
    static MPI_Op const min = make(&half_float_reduce<T, reduce_op::min>);
    return op == reduce_op::max ? max : op == reduce_op::min ? min : sum;
  } else {
    return mpi_op(op);
  }
}

/// `data[i] *= factor`, rounded back to T.
template <half_float T>
void scale(T* data, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = T::from_float(data[i].to_float() * factor);
}

/// `data[i] *= s` (reduce_op::avg's division), in fixed-size blocks GCC vectorises at -O2.
template <class T>
void scale(T* __restrict data, std::size_t n, T s) {
  constexpr std::size_t block = 64;
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) data[i + j] *= s;
  for (; i < n; ++i) data[i] *= s;
}

/// MPI counts are `int`; larger buffers go in chunks of this many elements.
inline constexpr std::size_t max_chunk = static_cast<std::size_t>(INT_MAX) / 2;

/// Element types reduce_op::avg applies to, and the type of their scaling factor.
template <class T>
concept averageable = std::floating_point<T> || half_float<T>;
template <class T>
using scale_type = std::conditional_t<half_float<T>, float, T>;

[[noreturn]] inline void avg_needs_floating() {
  throw cohort::error("reduce_op::avg needs float, double, bfloat16 or float16 buffers: use reduce_op::sum and divide");
}

}  // namespace cohort::comm::detail
