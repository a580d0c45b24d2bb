#pragma once
// The engine's record of the module scopes open now: how many, which modules have a backward
// scope open (a second one of the same module is a usage error: the first would write into a
// gradient buffer the second's close had handed to the Reducer and freed), and where each
// scope object lives, so that an engine destroyed with scopes open can detach them instead of
// leaving them pointing at freed memory.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"

namespace zshard {

// A backward scope of m while another backward scope of m is open: its gradient buffers are the
// open scope's, so the engine refuses it (and the planner refuses such a schedule alike).
[[noreturn]] inline void throw_nested_backward(const model_spec& spec, module_id m) {
  throw error(error_kind::usage,
              "backward scope of module '" + spec.module(m).name + "' opened while another backward scope of it is open",
              "close the first backward(m) scope before opening another; a module used twice runs its two backward "
              "scopes one after the other");
}

// Scopes are linked through their own prev/next pointers (no allocation, a few stores per scope).
template <class Scope>
class scope_registry {
 public:
  void reset(std::size_t modules) { backward_open_.assign(modules, 0); }

  // Before a scope of m opens: a nested backward scope of m is refused.
  void check_can_open(const model_spec& spec, module_id m, bool backward) const {
    if (backward && backward_open_[m] != 0) [[unlikely]]
      throw_nested_backward(spec, m);
  }
  void opened(Scope* s, module_id m, bool backward) noexcept {
    s->prev_ = nullptr;
    s->next_ = head_;
    if (head_) head_->prev_ = s;
    head_ = s;
    ++count_;
    if (backward) ++backward_open_[m];
  }
  void ended(Scope* s, module_id m, bool backward) noexcept {
    (s->prev_ ? s->prev_->next_ : head_) = s->next_;
    if (s->next_) s->next_->prev_ = s->prev_;
    s->prev_ = s->next_ = nullptr;
    --count_;
    if (backward) --backward_open_[m];
  }
  void moved(Scope* from, Scope* to) noexcept {
    to->prev_ = from->prev_;
    to->next_ = from->next_;
    (to->prev_ ? to->prev_->next_ : head_) = to;
    if (to->next_) to->next_->prev_ = to;
    from->prev_ = from->next_ = nullptr;
  }

  int count() const noexcept { return count_; }

  // Engine destruction: detaches every open scope and says which were open.
  std::string orphan_all(const model_spec& spec) noexcept {
    std::string names;
    for (Scope* s = head_; s;) {
      Scope* next = s->next_;
      try {
        names += (names.empty() ? "'" : ", '") + spec.module(s->module()).name + "'" +
                 (s->is_backward() ? " (backward)" : "");
      } catch (...) {
      }
      s->orphan();
      s->prev_ = s->next_ = nullptr;
      s = next;
    }
    head_ = nullptr;
    count_ = 0;
    return names;
  }

 private:
  Scope* head_ = nullptr;
  int count_ = 0;
  std::vector<std::uint32_t> backward_open_;  // per module
};

}  // namespace zshard
