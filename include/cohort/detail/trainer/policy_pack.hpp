#pragma once
/// \file
/// A policy pack's metaprogramming, shared by cohort::trainer and cohort::tuner: each argument
/// checked to be a policy of exactly one axis, the first policy of an axis or its default, and the
/// policies of a kind (stoppers, callbacks) taken out of the pack.

#include <tuple>
#include <type_traits>

#include "cohort/concepts.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/data/datasets.hpp"

namespace cohort::detail::trainer {

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

}  // namespace cohort::detail::trainer
