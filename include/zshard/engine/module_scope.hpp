#pragma once
// The RAII scope a training stack holds around one use of a module. While it lives, the
// module's full parameters are gathered and readable; in a backward scope, f32 gradient
// buffers are there to accumulate into (+=). Closing the scope hands completed gradients to
// the Reducer and releases parameters the Prefetcher does not keep.
//
// close() reports failures as exceptions. The destructor cannot throw: a failure there marks
// the engine broken and the next engine call rethrows it (so a failed collective is never lost).
// A scope left by an exception (destroyed while unwinding) is abandoned, not closed: nothing
// is reduced (no collective runs from an unwinding destructor), its parameters are released,
// and the engine refuses to go on until engine::discard_gradients() on every rank.
// A scope that outlives its engine is detached by the engine's destructor (which reports it);
// using it afterwards is a usage error.
#include <cstddef>
#include <exception>
#include <utility>

#include "zshard/core/tensor_view.hpp"
#include "zshard/model/model_spec.hpp"

namespace zshard {

template <class Scope>
class scope_registry;
template <class Engine>
class scope_lifecycle;

template <class Engine>
class module_scope {
 public:
  module_scope(const module_scope&) = delete;
  module_scope& operator=(const module_scope&) = delete;
  module_scope(module_scope&& o) noexcept
      : engine_(std::exchange(o.engine_, nullptr)),
        module_(o.module_),
        backward_(o.backward_),
        orphaned_(o.orphaned_) {
    if (engine_) engine_->moved_scope(&o, this);
  }
  module_scope& operator=(module_scope&&) = delete;
  ~module_scope() {
    if (!engine_) return;
    // Unwinding: destroyed by an exception. (Asked here only, not at open: a scope opened and
    // closed by the destructor of an object unwinding would count as abandoned, a rare case
    // that discard_gradients() handles; the check at open would cost every scope a call.)
    if (std::uncaught_exceptions() > 0)
      engine_->abandon_scope(this);
    else
      engine_->exit_scope_nothrow(this);
  }

  // Ends the scope now; errors (a failed collective, an invariant) are thrown here.
  void close() {
    if (orphaned_) live();
    if (engine_) engine_->exit_scope(this);
  }

  module_id module() const noexcept { return module_; }
  // The stream the module's own kernels run on: everything the scope hands out is ready in its
  // order (the engine's compute stream: the backend's, or the one the stack gave the engine).
  const auto& stream() const { return live().compute_stream(); }
  bool is_backward() const noexcept { return backward_; }
  std::size_t param_count() const { return live().spec().module(module_).params.size(); }

  // The k-th parameter of the module (in registration order), full and unpadded.
  const_view param(std::size_t k) const { return live().param_view(module_, k); }
  template <class T>
  const T* param_data(std::size_t k) const {
    return param(k).template as<const T>().data();
  }

  // The k-th parameter's f32 gradient buffer; backward scopes and trainable parameters only.
  mutable_view grad(std::size_t k) const {
    ZSHARD_REQUIRE(backward_, error_kind::usage, "grad() is only available in a backward scope");
    return live().grad_view(module_, k);
  }
  float* grad_data(std::size_t k) const { return grad(k).template as<float>().data(); }

 private:
  friend Engine;
  friend class scope_lifecycle<Engine>;  // the engine's scope opening and closing
  template <class>
  friend class scope_registry;
  module_scope(Engine* e, module_id m, bool backward) noexcept
      : engine_(e), module_(m), backward_(backward) {
    e->opened_scope(this);
  }

  // The engine ends the scope (closed, abandoned) or, from its destructor, detaches it.
  void end() noexcept { engine_ = nullptr; }
  void orphan() noexcept {
    engine_ = nullptr;
    orphaned_ = true;
  }

  Engine& live() const {
    ZSHARD_REQUIRE(!orphaned_, error_kind::usage, "this scope outlived its engine (destroyed with the scope open)",
                   "close every scope before destroying the engine");
    ZSHARD_REQUIRE(engine_ != nullptr, error_kind::usage, "this scope was closed or moved from");
    return *engine_;
  }

  Engine* engine_;
  module_id module_;
  bool backward_;
  bool orphaned_ = false;
  module_scope* prev_ = nullptr;  // the engine's list of open scopes (engine/open_scopes.hpp)
  module_scope* next_ = nullptr;
};

}  // namespace zshard
