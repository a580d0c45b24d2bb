#pragma once
// A model of same-size blocks (what makes diverging ranks dangerous: every gather of one block
// pairs with a gather of any other) and experts (routing), driven by a per-rank schedule, with
// an untagged communicator that stands in for NCCL (it cannot carry collective tags).
#include <doctest/doctest.h>

#include <cstring>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"

namespace safety {

using namespace zshard;

// thread_comm without tags, as NCCL: only the schedule fingerprint can catch divergence.
class untagged_comm {
 public:
  using zshard_tag = communicator_tag;
  explicit untagged_comm(thread_comm& c) : c_(c) {}
  int rank() const noexcept { return c_.rank(); }
  int size() const noexcept { return c_.size(); }
  void all_gather(const void* s, void* d, std::size_t n, dtype t, comm_stream cs = {}) { c_.all_gather(s, d, n, t, cs); }
  void reduce_scatter(const void* s, void* d, std::size_t n, dtype t, reduce_op op, comm_stream cs = {}) {
    c_.reduce_scatter(s, d, n, t, op, cs);
  }
  void all_reduce(const void* s, void* d, std::size_t n, dtype t, reduce_op op, comm_stream cs = {}) {
    c_.all_reduce(s, d, n, t, op, cs);
  }
  void broadcast(void* d, std::size_t n, dtype t, int root, comm_stream cs = {}) { c_.broadcast(d, n, t, root, cs); }
  void barrier(comm_stream cs = {}) { c_.barrier(cs); }

 private:
  thread_comm& c_;
};
static_assert(check_communicator<untagged_comm>() && !tags_collectives<untagged_comm>);

// blocks b0..b{n-1} and experts e0..e{k-1}, every one a [7, 9] weight and a [9] bias (bf16, so
// gathers never pair with the engine's own f32 exchanges: only same-size gathers mix).
inline model_spec stack_spec(int blocks, int experts) {
  model_spec spec;
  auto add = [&](const std::string& name) {
    const param_id w = spec.add_param(name + ".w", {7, 9}), b = spec.add_param(name + ".b", {9}, {.decay = false});
    spec.add_module(name, {w, b});
  };
  for (int i = 0; i < blocks; ++i) add("b" + std::to_string(i));
  for (int i = 0; i < experts; ++i) add("e" + std::to_string(i));
  return spec;
}

inline engine_config stack_config() {
  engine_config c;
  c.param_dtype = dtype::bf16;
  c.prefetch.prefetch_numel = 0;  // gathers in scope order only: the schedule alone decides them
  c.reduce.reduce_bucket_numel = 1;
  c.log = [](const std::string&) {};
  return c;
}

struct schedule {
  std::vector<module_id> forward;  // backward runs the counted forwards in reverse
  engine_config cfg = stack_config();
};

struct outcome {
  std::optional<std::string> error;  // what run_ranks rethrew
  std::vector<int> trained;          // per rank: did any shard change

  // The run failed with an error that says every one of `parts`.
  void check_error_says(std::initializer_list<std::string> parts) const {
    REQUIRE(error);
    INFO(*error);
    for (const auto& part : parts) CHECK(error->find(part) != std::string::npos);
  }
};

// One step of schedules[rank] on every rank (gradients filled with fixed values), then a
// second; records whether any rank's working shards changed.
template <bool tagged>
outcome run_schedules(const model_spec& spec, const std::vector<schedule>& schedules,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20'000)) {
  const int world = static_cast<int>(schedules.size());
  outcome out;
  out.trained.assign(std::size_t(world), 0);
  std::mutex mu;
  try {
    run_ranks(
        world,
        [&](thread_comm& tc) {
          host_backend backend;
          untagged_comm uc(tc);
          auto body = [&](auto& comm) {
            const schedule& s = schedules[std::size_t(tc.rank())];
            engine<host_backend, std::decay_t<decltype(comm)>> eng(backend, comm, spec, s.cfg);
            std::vector<std::vector<char>> before;
            for (param_id p = 0; p < spec.params().size(); ++p) {
              const auto& sh = eng.store()[p].shard;
              before.emplace_back(static_cast<const char*>(sh.data()), static_cast<const char*>(sh.data()) + sh.bytes());
            }
            auto changed = [&] {
              for (param_id p = 0; p < spec.params().size(); ++p)
                if (std::memcmp(before[p].data(), eng.store()[p].shard.data(), before[p].size()) != 0) return 1;
              return 0;
            };
            try {
              for (int step = 0; step < 2; ++step) {
                for (module_id m : s.forward) eng.forward(m).close();
                eng.begin_backward();
                for (std::size_t i = s.forward.size(); i-- > 0;) {
                  auto g = eng.backward(s.forward[i]);
                  for (std::size_t k = 0; k < g.param_count(); ++k) {
                    auto v = g.grad(k);
                    for (std::size_t j = 0; j < v.numel(); ++j) g.grad_data(k)[j] += 0.01f * float(k + 1 + j % 5);
                  }
                }
                eng.end_backward();
                eng.step();
              }
            } catch (...) {
              std::lock_guard lk(mu);
              out.trained[std::size_t(tc.rank())] = changed();
              throw;
            }
            std::lock_guard lk(mu);
            out.trained[std::size_t(tc.rank())] = changed();
          };
          if constexpr (tagged)
            body(tc);
          else
            body(uc);
        },
        timeout);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace safety
