#pragma once
// Parameter and module ids that carry the identity of the model_spec that made them.
//
// Two models in one process (a student and a teacher, two engines of different models) both
// number their parameters from 0, so a bare index of model B is usually in range for model A:
// used on A it would silently read or train the wrong parameter. An id returned by a
// model_spec (add_param, add_module, param_by_name, module_by_name, param_ids(), module_ids(),
// module(m).params) is *bound*: it carries that spec's serial, and every public entry point
// that takes an id (model_spec's accessors, the engine's scopes, gather_param, layout,
// set_trainable, the state and shard access, the schedule recorder) rejects a bound id of
// another spec with a usage error naming both specs.
//
// An id made from a bare integer (`param_id{3}`, `param_id p = 0`, an index read from a file)
// is *unbound*: it names an index only and gets the range check alone. That keeps loops over
// `0..n` and schedules stored as numbers working; prefer the bound ids a spec hands out.
//
// An id converts implicitly to its index, so engine internals and policies index their vectors
// with it at no cost; the conversion drops the identity, which is why the checks sit at the
// entry points. Comparisons and hashing look at the index only: ids are compared within one
// model, and an unbound id equals the bound id of the same index.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>

namespace zshard {

class model_spec;

template <class Kind>
class spec_id {
 public:
  // The serial of an unbound id; model_spec serials start at 1.
  static constexpr std::uint32_t unbound = 0;

  constexpr spec_id() noexcept = default;
  // Unbound: an index only (range-checked where used). Implicit so that `param_id p = 0` and
  // loops over indices keep working.
  constexpr spec_id(std::uint32_t index) noexcept : index_(index) {}  // NOLINT(google-explicit-constructor)

  constexpr std::uint32_t index() const noexcept { return index_; }
  // The serial of the model_spec that made this id, or `unbound`.
  constexpr std::uint32_t spec_serial() const noexcept { return spec_; }
  constexpr bool bound() const noexcept { return spec_ != unbound; }

  constexpr operator std::uint32_t() const noexcept { return index_; }  // NOLINT(google-explicit-constructor)

  // Stepping keeps the binding: the next id of the same model (for loops over bound ids).
  constexpr spec_id& operator++() noexcept {
    ++index_;
    return *this;
  }
  constexpr spec_id operator++(int) noexcept {
    spec_id old = *this;
    ++index_;
    return old;
  }
  constexpr spec_id& operator--() noexcept {
    --index_;
    return *this;
  }
  constexpr spec_id operator--(int) noexcept {
    spec_id old = *this;
    --index_;
    return old;
  }

 private:
  friend class model_spec;
  constexpr spec_id(std::uint32_t index, std::uint32_t spec) noexcept : index_(index), spec_(spec) {}

  std::uint32_t index_ = 0;
  std::uint32_t spec_ = unbound;
};

struct param_id_kind {};
struct module_id_kind {};
using param_id = spec_id<param_id_kind>;
using module_id = spec_id<module_id_kind>;

// The ids 0..n-1 of one model, bound to it: `for (param_id p : spec.param_ids())`.
template <class Id>
class id_range {
 public:
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Id;
    using difference_type = std::ptrdiff_t;
    using pointer = const Id*;
    using reference = Id;
    iterator() = default;
    explicit iterator(Id at) noexcept : at_(at) {}
    Id operator*() const noexcept { return at_; }
    iterator& operator++() noexcept {
      ++at_;
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++at_;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.at_.index() == b.at_.index(); }

   private:
    Id at_{};
  };

  id_range(Id first, std::uint32_t count) noexcept : first_(first), count_(count) {}
  iterator begin() const noexcept { return iterator(first_); }
  iterator end() const noexcept { return iterator(Id(first_.index() + count_)); }  // iterators compare indices
  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

 private:
  Id first_;
  std::uint32_t count_;
};

}  // namespace zshard

namespace std {
template <class Kind>
struct hash<zshard::spec_id<Kind>> {
  std::size_t operator()(const zshard::spec_id<Kind>& id) const noexcept {
    return std::hash<std::uint32_t>{}(id.index());
  }
};
}  // namespace std
