#pragma once
/// \file
/// comm::any: a type-erased communicator, so that cohort::context (which user functors take by
/// reference) does not depend on the communicator type a trainer was given. One virtual call per
/// collective; requests are stored in place (no allocation per collective).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "cohort/comm/communicator.hpp"

namespace cohort::comm {

/// A type-erased request; holds any request type of up to 128 bytes in place.
class any_request {
 public:
  any_request() = default;
  template <request R>
    requires(!std::same_as<std::remove_cvref_t<R>, any_request>)
  any_request(R r) {  // NOLINT: implicit by design
    static_assert(sizeof(R) <= sizeof(storage_) && alignof(R) <= alignof(std::max_align_t),
                  "request type too large for comm::any_request's in-place storage");
    new (storage_) R(std::move(r));
    vt_ = &vtable_for<R>;
  }
  any_request(any_request&& o) noexcept { take(o); }
  any_request& operator=(any_request&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  ~any_request() { reset(); }

  /// Blocks until the collective has completed.
  void wait() {
    if (vt_) vt_->wait(storage_);
  }
  /// Drives progress; true once complete.
  bool test() { return vt_ ? vt_->test(storage_) : true; }

 private:
  struct vtable {
    void (*wait)(void*);
    bool (*test)(void*);
    void (*move_to)(void* src, void* dst) noexcept;
    void (*destroy)(void*) noexcept;
  };
  template <class R>
  static constexpr vtable vtable_for{
      [](void* p) { static_cast<R*>(p)->wait(); },
      [](void* p) { return static_cast<R*>(p)->test(); },
      [](void* src, void* dst) noexcept { new (dst) R(std::move(*static_cast<R*>(src))); },
      [](void* p) noexcept { static_cast<R*>(p)->~R(); },
  };
  void take(any_request& o) noexcept {
    if (!o.vt_) return;
    o.vt_->move_to(o.storage_, storage_);
    vt_ = o.vt_;
    o.reset();
  }
  void reset() noexcept {
    if (vt_) vt_->destroy(storage_);
    vt_ = nullptr;
  }
  alignas(std::max_align_t) std::byte storage_[128];
  vtable const* vt_ = nullptr;
};

/// A type-erased communicator. `any(std::move(c))` takes ownership of `c` (an lvalue is refused,
/// so nothing is moved from by accident); `any::ref(c)` refers to `c`, which must outlive it.
/// Splits are owned.
class any {
 public:
  template <communicator C>
    requires(!std::same_as<std::remove_cvref_t<C>, any> && !std::is_lvalue_reference_v<C>)
  explicit any(C&& c) : impl_(std::make_unique<model<std::remove_cvref_t<C>, std::remove_cvref_t<C>>>(std::move(c))) {}

  /// A non-owning view of `c`.
  template <communicator C>
  static any ref(C& c) {
    any a;
    a.impl_ = std::make_unique<model<C, C*>>(&c);
    return a;
  }

  any(any&&) noexcept = default;
  any& operator=(any&&) noexcept = default;

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  template <reducible T>
  void allreduce(T* data, std::size_t n, reduce_op op) { impl_->allreduce(data, n, op); }
  template <reducible T>
  any_request iallreduce(T* data, std::size_t n, reduce_op op) { return impl_->iallreduce(data, n, op); }
  void broadcast(std::byte* data, std::size_t bytes, int root) { impl_->broadcast(data, bytes, root); }
  void allgather(std::byte const* send, std::size_t bytes, std::byte* recv) { impl_->allgather(send, bytes, recv); }
  void barrier() { impl_->barrier(); }
  any split(int color, int key) const { return impl_->split(color, key); }

  /// The communicator inside, when it is a `C` (owned or referred to), else null: for code that
  /// needs what only one backend has (prepare_model bootstraps NCCL from an MPI communicator).
  template <communicator C>
  C* target() {
    return static_cast<C*>(impl_->target(typeid(C)));
  }

 private:
  any() = default;

#define COHORT_ANY_REDUCE(T)                                                 \
  virtual void allreduce(T* d, std::size_t n, reduce_op op) = 0;             \
  virtual any_request iallreduce(T* d, std::size_t n, reduce_op op) = 0;
  struct base {
    virtual ~base() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    COHORT_REDUCIBLE_TYPES(COHORT_ANY_REDUCE)
    virtual void broadcast(std::byte* d, std::size_t b, int root) = 0;
    virtual void allgather(std::byte const* s, std::size_t b, std::byte* r) = 0;
    virtual void barrier() = 0;
    virtual any split(int color, int key) const = 0;
    virtual void* target(std::type_info const& type) = 0;
  };
#undef COHORT_ANY_REDUCE

#define COHORT_ANY_REDUCE(T)                                                                       \
  void allreduce(T* d, std::size_t n, reduce_op op) override { get().allreduce(d, n, op); }       \
  any_request iallreduce(T* d, std::size_t n, reduce_op op) override { return get().iallreduce(d, n, op); }
  template <class C, class Holder>
  struct model final : base {
    explicit model(Holder h) : held(std::move(h)) {}
    C& get() {
      if constexpr (std::is_pointer_v<Holder>) return *held;
      else return held;
    }
    C const& get() const {
      if constexpr (std::is_pointer_v<Holder>) return *held;
      else return held;
    }
    int rank() const override { return get().rank(); }
    int size() const override { return get().size(); }
    COHORT_REDUCIBLE_TYPES(COHORT_ANY_REDUCE)
    void broadcast(std::byte* d, std::size_t b, int root) override { get().broadcast(d, b, root); }
    void allgather(std::byte const* s, std::size_t b, std::byte* r) override { get().allgather(s, b, r); }
    void barrier() override { get().barrier(); }
    any split(int color, int key) const override { return any(get().split(color, key)); }
    void* target(std::type_info const& type) override { return type == typeid(C) ? &get() : nullptr; }
    Holder held;
  };
#undef COHORT_ANY_REDUCE

  std::unique_ptr<base> impl_;
};

static_assert(communicator<any>);
static_assert(request<any_request>);

}  // namespace cohort::comm
