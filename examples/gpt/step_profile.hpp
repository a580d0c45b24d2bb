#pragma once
// Where a training step's time goes, per rank: the model's own math (compute), collectives
// (communication), the optimizer step (optimizer, without its collectives), and the rest, which
// is zshard's bookkeeping and memory traffic around the scopes (engine). What 02_train_gpt
// --profile prints and what bench/example_throughput reports.
//
// Communication is timed by wrapping the rank's communicator (timed_comm forwards every
// collective and adds its wall time); compute by the runner around each layer call; the
// optimizer around engine::step(). A rank's collective time includes waiting for slower ranks.
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"

namespace gpt {

struct step_profile {
  double total = 0, compute = 0, comm = 0, optimizer = 0;  // seconds, summed over steps
  double comm_in_step = 0;  // collectives inside engine::step(): part of comm, not of optimizer
  long steps = 0;

  double engine() const { return total - compute - comm - (optimizer - comm_in_step); }
  double optimizer_only() const { return optimizer - comm_in_step; }
  void clear() { *this = step_profile{}; }
  step_profile& operator+=(const step_profile& o) {
    total += o.total;
    compute += o.compute;
    comm += o.comm;
    optimizer += o.optimizer;
    comm_in_step += o.comm_in_step;
    steps += o.steps;
    return *this;
  }
  // "compute 71.2%  engine 6.1%  communication 12.0%  optimizer 10.7%  (per step 12.40 ms)"
  void print(const char* prefix) const {
    const double t = total > 0 ? total : 1;
    std::printf("%scompute %.1f%%  engine %.1f%%  communication %.1f%%  optimizer %.1f%%  (per step %.2f ms)\n", prefix,
                100 * compute / t, 100 * engine() / t, 100 * comm / t, 100 * optimizer_only() / t,
                steps ? 1e3 * total / double(steps) : 0.0);
  }
};

// Adds the wall time of a scope to `*into` (no-op when into is null).
class profile_timer {
 public:
  explicit profile_timer(double* into) : into_(into) {
    if (into_) t0_ = std::chrono::steady_clock::now();
  }
  ~profile_timer() {
    if (into_) *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  profile_timer(const profile_timer&) = delete;
  profile_timer& operator=(const profile_timer&) = delete;

 private:
  double* into_;
  std::chrono::steady_clock::time_point t0_{};
};

// A communicator that forwards to `inner` and adds each collective's wall time to `seconds`.
// It takes the engine's collective tags and passes them on where `inner` checks them (threads,
// MPI), so timing a run never weakens its cross-rank checks. It splits as its inner
// communicator does (hybrid sharding builds its groups with split()): the sub-group's
// communicator is owned by the returned wrapper and timed into the same `seconds`.
template <class Comm>
class timed_comm {
 public:
  using zshard_tag = zshard::communicator_tag;
  timed_comm(Comm& inner, double& seconds) : inner_(&inner), seconds_(&seconds) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  void all_gather(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::comm_stream s = {},
                  const zshard::collective_tag& tag = {}) {
    profile_timer timer(seconds_);
    zshard::tagged::all_gather(*inner_, src, dst, count, t, s, tag);
  }
  void reduce_scatter(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::reduce_op op,
                      zshard::comm_stream s = {}, const zshard::collective_tag& tag = {}) {
    profile_timer timer(seconds_);
    zshard::tagged::reduce_scatter(*inner_, src, dst, count, t, op, s, tag);
  }
  void all_reduce(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::reduce_op op,
                  zshard::comm_stream s = {}, const zshard::collective_tag& tag = {}) {
    profile_timer timer(seconds_);
    zshard::tagged::all_reduce(*inner_, src, dst, count, t, op, s, tag);
  }
  void broadcast(void* dst, std::size_t count, zshard::dtype t, int root, zshard::comm_stream s = {},
                 const zshard::collective_tag& tag = {}) {
    profile_timer timer(seconds_);
    zshard::tagged::broadcast(*inner_, dst, count, t, root, s, tag);
  }
  void barrier(zshard::comm_stream s = {}) {
    profile_timer timer(seconds_);
    inner_->barrier(s);
  }
  // Sub-groups, as the inner communicator makes them (a collective over this communicator).
  timed_comm split(int color, int key)
    requires zshard::splittable<Comm>
  {
    profile_timer timer(seconds_);
    return timed_comm(std::make_shared<Comm>(inner_->split(color, key)), *seconds_);
  }
  // Which ranks share a node (hybrid sharding checks its groups against them), where the inner
  // communicator knows.
  std::vector<int> node_ids()
    requires requires(Comm& c) { c.node_ids(); }
  {
    return inner_->node_ids();
  }
  Comm& inner() { return *inner_; }

 private:
  timed_comm(std::shared_ptr<Comm> owned, double& seconds) : owned_(std::move(owned)), inner_(owned_.get()), seconds_(&seconds) {}

  std::shared_ptr<Comm> owned_;  // a split's communicator; null when wrapping the caller's
  Comm* inner_;
  double* seconds_;
};

}  // namespace gpt
