#pragma once
// An owning, move-only allocation on a backend, charged to the backend's ledger under one
// category for its whole life (I8). The destructor returns the bytes to the backend.
//
// On a backend with stream-ordered memory (CUDA) a buffer can be allocated in the order of a
// given stream and freed in the order of another (reset_on): a gathered parameter is allocated
// where the gather runs, a gradient freed where its reduction ran. Plain construction and
// reset() use the backend's default stream; on other backends the stream is ignored.
#include <cstddef>
#include <utility>

#include "zshard/core/checked_size.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/memory_ledger.hpp"

namespace zshard {

template <class Backend>
class buffer {
 public:
  buffer() = default;
  // Each field is set from an argument, not read back from the object: a buffer made to be
  // moved into place (`s.full_grad = buffer(...)`, per parameter per scope) then moves from
  // registers, where reloading a temporary just written stalls a store-to-load forward
  // (engine_overhead: 7 ns per module at the end of backward).
  buffer(Backend& b, dtype type, std::size_t numel, mem_category c)
      : backend_(&b), data_(allocate(b, type, numel, c)), numel_(numel), type_(type), category_(c) {}
  template <class Stream>
  buffer(Backend& b, dtype type, std::size_t numel, mem_category c, Stream& s)
      : backend_(&b), data_(allocate(b, type, numel, c, s)), numel_(numel), type_(type), category_(c) {}
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept
      : backend_(o.backend_), data_(o.data_), numel_(o.numel_), type_(o.type_), category_(o.category_) {
    o.forget();
  }
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      data_ = o.data_;
      numel_ = o.numel_;
      type_ = o.type_;
      category_ = o.category_;
      o.forget();
    }
    return *this;
  }
  ~buffer() { reset(); }

  void reset() noexcept {
    if (backend_) free_now();
  }

  // Frees in the order of s: every use of the buffer must be ordered before this point of s.
  template <class Stream>
  void reset_on(Stream& s) noexcept {
    if (backend_) free_on(s);
  }

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  dtype type() const noexcept { return type_; }
  std::size_t numel() const noexcept { return numel_; }
  std::size_t bytes() const noexcept { return numel_ * size_of(type_); }
  mem_category category() const noexcept { return category_; }
  explicit operator bool() const noexcept { return backend_ != nullptr; }

 private:
  static void* allocate(Backend& b, dtype type, std::size_t numel, mem_category c) {
    return b.allocate(checked_mul(numel, size_of(type), "buffer bytes"), c);
  }
  template <class Stream>
  static void* allocate(Backend& b, dtype type, std::size_t numel, mem_category c, Stream& s) {
    const std::size_t bytes = checked_mul(numel, size_of(type), "buffer bytes");
    if constexpr (requires { b.allocate(bytes, c, s); })
      return b.allocate(bytes, c, s);
    else
      return b.allocate(bytes, c);
  }
  void free_now() noexcept {
    backend_->deallocate(data_, bytes(), category_);
    forget();
  }
  template <class Stream>
  void free_on(Stream& s) noexcept {
    if constexpr (requires { backend_->deallocate(data_, bytes(), category_, s); })
      backend_->deallocate(data_, bytes(), category_, s);
    else
      backend_->deallocate(data_, bytes(), category_);
    forget();
  }

  void forget() noexcept {  // owns nothing now (the bytes went back, or moved to another buffer)
    backend_ = nullptr;
    data_ = nullptr;
    numel_ = 0;
  }

  // 32 bytes: the engine keeps three per parameter, and its per-scope work reads them.
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  std::size_t numel_ = 0;
  dtype type_ = dtype::f32;
  mem_category category_ = mem_category::scratch;
};

}  // namespace zshard
