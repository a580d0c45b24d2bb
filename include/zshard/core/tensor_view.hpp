#pragma once
// Non-owning views: a pointer, its dtype and a shape. The engine hands these to the training
// stack inside scopes; they are valid only while the scope that produced them is alive.
#include <cstddef>
#include <span>

#include "zshard/core/dtype.hpp"
#include "zshard/core/shape.hpp"

namespace zshard {

template <class T>
class tensor_view {
 public:
  tensor_view() = default;
  tensor_view(T* data, dtype type, zshard::shape s) : data_(data), type_(type), shape_(s) {}

  T* data() const noexcept { return data_; }
  dtype type() const noexcept { return type_; }
  const zshard::shape& shape() const noexcept { return shape_; }
  std::size_t numel() const noexcept { return static_cast<std::size_t>(shape_.numel()); }
  std::size_t bytes() const noexcept { return numel() * size_of(type_); }

  // Typed access; the element type must match the view's dtype.
  template <class E>
  std::span<E> as() const {
    ZSHARD_REQUIRE(dtype_of<std::remove_const_t<E>> == type_, error_kind::usage,
                   "view holds " + std::string(to_string(type_)) + ", requested " +
                       std::string(to_string(dtype_of<std::remove_const_t<E>>)));
    return {static_cast<E*>(data_), numel()};
  }

  operator tensor_view<const T>() const requires(!std::is_const_v<T>) { return {data_, type_, shape_}; }

 private:
  T* data_ = nullptr;
  dtype type_ = dtype::f32;
  zshard::shape shape_{};
};

using mutable_view = tensor_view<void>;
using const_view = tensor_view<const void>;

}  // namespace zshard
