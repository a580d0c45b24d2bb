#pragma once
// A communicator that forwards every collective to a thread_comm and counts them by their use
// (collective_tag::use): how tests see which collectives the engine issues (a step's one
// exchange, the gathers of scopes apart from the ranks' agreement exchanges).
#include <map>

#include "zshard/comm/communicator.hpp"
#include "zshard/comm/thread_comm.hpp"

namespace test_support {

struct use_counting_comm {
  using zshard_tag = zshard::communicator_tag;
  zshard::thread_comm& inner;
  std::map<zshard::collective_use, int> calls{};
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  // The parameter all-gathers of scopes, on demand and ahead.
  int gathers() const { return count(zshard::collective_use::gather) + count(zshard::collective_use::gather_ahead); }
  int count(zshard::collective_use u) const {
    const auto it = calls.find(u);
    return it == calls.end() ? 0 : it->second;
  }

  void all_gather(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::comm_stream cs,
                  const zshard::collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.all_gather(s, d, n, t, cs, tag);
  }
  void reduce_scatter(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::reduce_op op,
                      zshard::comm_stream cs, const zshard::collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.reduce_scatter(s, d, n, t, op, cs, tag);
  }
  void all_reduce(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::reduce_op op, zshard::comm_stream cs,
                  const zshard::collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.all_reduce(s, d, n, t, op, cs, tag);
  }
  void broadcast(void* d, std::size_t n, zshard::dtype t, int root, zshard::comm_stream cs,
                 const zshard::collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.broadcast(d, n, t, root, cs, tag);
  }
  void barrier(zshard::comm_stream cs) { inner.barrier(cs); }
};
static_assert(zshard::tags_collectives<use_counting_comm>);

}  // namespace test_support
