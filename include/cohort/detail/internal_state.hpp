#pragma once
/// \file
/// cohort::detail::internal_state: what a policy keeps between calls, private to the policy.

#include <utility>

namespace cohort::detail {

/// The state a policy aggregate (a searcher, scheduler or stopper whose knobs are set with
/// designated initializers) keeps between calls. It is a public member of the aggregate, so that
/// `schedule::asha{.max_t = 20}` still works and leaves it value-initialised, but its contents
/// (`T`, a private base) are reached only by `Owner`. It is copied with its owner.
template <class T, class Owner>
class internal_state : private T {
  friend Owner;

 public:
  internal_state() : T() {}

 private:
  /// Replaces the state (the owner's setup: `state_ = detail::tpe_state{...};`).
  internal_state& operator=(T value) {
    static_cast<T&>(*this) = std::move(value);
    return *this;
  }
};

}  // namespace cohort::detail
