#pragma once
/// \file
/// What a user functor takes: the config type of `fn(context&, config const&)`.

#include <cstddef>
#include <tuple>
#include <type_traits>

namespace cohort::detail {

template <class Sig>
struct member_signature {
  static constexpr bool known = false;
};
#define COHORT_MEMBER_SIGNATURE(QUALS)                  \
  template <class C, class R, class... A>               \
  struct member_signature<R (C::*)(A...) QUALS> {       \
    static constexpr bool known = true;                 \
    using args = std::tuple<A...>;                      \
  };
COHORT_MEMBER_SIGNATURE()
COHORT_MEMBER_SIGNATURE(const)
COHORT_MEMBER_SIGNATURE(noexcept)
COHORT_MEMBER_SIGNATURE(const noexcept)
COHORT_MEMBER_SIGNATURE(&)
COHORT_MEMBER_SIGNATURE(const&)
#undef COHORT_MEMBER_SIGNATURE

/// The argument types of a callable with one (non-template) call operator, or of a function.
template <class F>
struct call_signature {
  static constexpr bool known = false;
};
template <class F>
  requires requires { &F::operator(); }
struct call_signature<F> : member_signature<decltype(&F::operator())> {};
template <class R, class... A>
struct call_signature<R (*)(A...)> {
  static constexpr bool known = true;
  using args = std::tuple<A...>;
};
template <class R, class... A>
struct call_signature<R(A...)> : call_signature<R (*)(A...)> {};

template <class F, class Given, bool = call_signature<F>::known>
struct config_param {
  using type = Given;
};
template <class F, class Given>
struct config_param<F, Given, true> {
  using args = typename call_signature<F>::args;
  using type = std::conditional_t<(std::tuple_size_v<args> == 2),
                                  std::remove_cvref_t<std::tuple_element_t<(std::tuple_size_v<args> == 2 ? 1 : 0), args>>,
                                  Given>;
};

/// The config type the functor `F` takes when fit() is given a `Given`: the functor's declared
/// second parameter, or `Given` itself for generic lambdas.
template <class F, class Given>
using config_param_t = typename config_param<std::remove_cvref_t<F>, Given>::type;

}  // namespace cohort::detail
