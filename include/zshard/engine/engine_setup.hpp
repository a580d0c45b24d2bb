#pragma once
// The engine's construction: argument checks, rank-tagged log, trace start, initial shard values.
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/core/buffer.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/state/stream_roles.hpp"
#include "zshard/trace/trace_sink.hpp"

namespace zshard {

template <class Engine>
class engine_setup {
  using backend_type = typename Engine::backend_type;
  using comm_type = typename Engine::comm_type;

 public:
  static comm_type& checked_reduce_comm(comm_type& comm, comm_type& reduce) {
    ZSHARD_REQUIRE(reduce.rank() == comm.rank() && reduce.size() == comm.size(), error_kind::config,
                   "the reduce communicator is rank " + std::to_string(reduce.rank()) + " of " +
                       std::to_string(reduce.size()) + ", the engine's communicator rank " +
                       std::to_string(comm.rank()) + " of " + std::to_string(comm.size()),
                   "give reductions a communicator over the same ranks in the same order (ncclCommSplit with one "
                   "colour and key = rank, or a second communicator of the same world)");
    return reduce;
  }

  static model_spec validated(model_spec s) {
    s.validate();
    return s;
  }
  // Also tags every log line with the rank that says it.
  static engine_config validated(engine_config c, int rank) {
    c.validate();
    c.log = [sink = std::move(c.log), rank](const std::string& line) {
      say(sink, "rank " + std::to_string(rank) + ": " + line);
    };
    return c;
  }

  // The rank's share of the trace, watching its ledger from before the first allocation.
  static rank_trace* start_trace(backend_type& backend, const engine_config& c, int rank) {
    if (!c.trace) return nullptr;
    rank_trace& t = c.trace->rank(rank);
    t.watch(backend.ledger());
    return &t;
  }

  // Rank r computes exactly its shard's initial values from the global element index.
  static void initialize_parameters(Engine& e) {
    if constexpr (backend_type::holds_storage) {
      const auto rank = e.comm_.rank();
      std::vector<float> values;
      for (param_id p = 0; p < e.store_.size(); ++p) {
        auto& s = e.store_[p];
        const std::size_t n = s.layout.shard_numel;
        values.assign(n, 0.0f);
        const std::size_t begin = s.layout.owned_begin(rank), end = s.layout.owned_end(rank);
        for (std::size_t g = begin; g < end; ++g) values[g - begin] = s.spec->init(static_cast<std::int64_t>(g));
        auto& compute = e.store_.streams().on(stream_role::compute);
        buffer<backend_type> staging = e.scratch(dtype::f32, n);
        e.backend_.copy(staging.data(), values.data(), n * sizeof(float), compute);
        if (void* host = e.store_.host_shard(p))  // offloaded (param_store.hpp): written where it lives
          zshard::convert(values.data(), dtype::f32, host, s.type, n);
        else
          e.backend_.convert(staging.data(), dtype::f32, s.shard.data(), s.type, n, compute);
        if (s.spec->trainable) e.offloader_.init_param(p, staging.template as<float>());
        e.backend_.synchronize(compute);
      }
    }
  }
};

}  // namespace zshard
