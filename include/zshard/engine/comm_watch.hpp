#pragma once
// The engine's hold on its communicators' health while it waits on the host.
//
// Where both sides support it (cuda_backend's wait_watch, nccl_comm's poll_health), every host
// wait of the backend — synchronize, event waits, copies to pageable memory — also checks the
// communicators between polls, so an NCCL asynchronous error or a failed peer ends the wait at
// once instead of after the backend's timeout (core/host_wait.hpp). The registration lasts as
// long as this object. abort_all() aborts the communicators that can abort (NCCL), for an
// engine torn down while an exception unwinds: its peers may wait for collectives it will
// never issue, and its own queued collectives for theirs.
#include <concepts>
#include <cstddef>
#include <string>

namespace zshard {

template <class Backend, class Comm>
class comm_watch {
 public:
  static constexpr bool can_watch = requires(Backend& b, Comm& c) {
    { b.watch().add([] {}) } -> std::convertible_to<std::size_t>;
    b.watch().remove(std::size_t{});
    c.poll_health();
  };
  static constexpr bool can_abort = requires(Comm& c, const std::string& why) { c.abort(why); };

  // `reduce` may be `comm` itself. Hybrid sharding adds the replica group's communicator and the
  // world's (engine/hybrid_groups.hpp); null when there are none.
  comm_watch(Backend& backend, Comm& comm, Comm& reduce, Comm* replica = nullptr, Comm* world = nullptr)
      : backend_(backend), comm_(comm), reduce_(reduce), replica_(replica), world_(world) {
    if constexpr (can_watch) handle_ = backend.watch().add([this] {
        comm_.poll_health();
        if (&reduce_ != &comm_) reduce_.poll_health();
        if (replica_) replica_->poll_health();
        if (world_) world_->poll_health();
      });
  }
  comm_watch(const comm_watch&) = delete;
  comm_watch& operator=(const comm_watch&) = delete;
  ~comm_watch() {
    if constexpr (can_watch) backend_.watch().remove(handle_);
  }

  void abort_all(const std::string& why) noexcept {
    if constexpr (can_abort) {
      comm_.abort(why);
      if (&reduce_ != &comm_) reduce_.abort(why);
      if (replica_) replica_->abort(why);
      if (world_) world_->abort(why);
    }
  }

 private:
  Backend& backend_;
  Comm& comm_;
  Comm& reduce_;
  Comm* replica_;
  Comm* world_;
  std::size_t handle_ = 0;
};

}  // namespace zshard
