#pragma once
// A parameter's full value, gradient and optimizer state across ranks, as DeepSpeed's
// GatheredParameters(modifier_rank=...) and safe_get/set_full_* do. Every function here is a
// COLLECTIVE: every rank calls it with the same parameter (and writer rank), at the same point
// of the loop; the writes first check, in one exchange (rank_agreement::same_arguments), that
// the ranks agree and that the writer's value has the right size, so a bad call fails on every
// rank alike instead of hanging the others. Memory is bounded by one parameter: its full padded
// value once on the backend (scratch, for the call) and once in host memory.
//
//   gather_param(p)                 the full value as f32, on every rank (any time outside a scope)
//   write_param(p, value, writer)   rank `writer`'s value (a rank of the world, also with hybrid
//                                   sharding) becomes p's value on every rank: working
//                                   shards (rounded to p's dtype) and, for a trainable parameter,
//                                   the f32 master; other ranks pass an empty span. Between steps.
//   gather_grad(p)                  p's gradient as the optimizer will see it before clipping:
//                                   reduced over ranks, summed over the micro-batches since the
//                                   last step, divided by their number and the loss scale (the
//                                   mean over the global batch). After end_backward(), before
//                                   step(); not while gradients are held unreduced (sync off).
//   gather_optimizer_state(p, f)    f = master, m or v of a trainable parameter; between steps
//   write_optimizer_state(p, f, value, writer)   f = m or v (write the master with write_param,
//                                   which keeps it and the working value together); between steps.
//                                   m must be finite, v finite and >= 0: anything else would turn
//                                   the parameter into NaN at the next step, so it is refused on
//                                   every rank, naming the first bad element, before anything changes
// They are built on the per-rank state access (state/state_access.hpp: read_shard/write_shard)
// through state/param_access.hpp's gather_field/scatter_field; the gradient comes from the
// Offloader's read_grad (offload/offloader.hpp).
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/format.hpp"
#include "zshard/engine/engine_checks.hpp"
#include "zshard/engine/training_controls.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/state/param_access.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard {

template <class Engine>
class full_state {
  using backend_type = typename Engine::backend_type;

 public:
  static std::vector<float> gather_param(Engine& e, param_id p) {
    e.rethrow_if_broken();
    engine_checks::param_id_in_range(e.spec_, p, "gather_param");
    const auto& s = e.store_[p];
    auto& streams = e.store_.streams();
    auto& compute = streams.on(stream_role::compute);
    buffer<backend_type> staging = e.scratch(dtype::f32, s.layout.padded_numel);
    if (s.layout.replicated) {
      e.backend_.convert(s.shard.data(), s.type, staging.data(), dtype::f32, s.layout.numel, compute);
    } else {  // gathered in the working dtype, then widened: the planner's gather_scratch
      buffer<backend_type> full = e.scratch(s.type, s.layout.padded_numel);
      struct unstage {  // an offloaded shard's staged copy (param_store.hpp), on success or failure
        decltype(e.store_)& store;
        ~unstage() { store.gathers_issued(stream_role::compute); }
      } staged{e.store_};
      tagged::all_gather(e.comm_, e.store_.gather_source(p, stream_role::compute), full.data(), s.layout.shard_numel,
                         s.type, streams.collective_on(stream_role::compute),
                         {collective_use::gather_param, collective_tag::none, p});
      e.backend_.convert(full.data(), s.type, staging.data(), dtype::f32, s.layout.numel, compute);
    }
    std::vector<float> out(s.layout.numel);
    e.backend_.copy(out.data(), staging.data(), out.size() * sizeof(float), compute);
    e.backend_.synchronize(compute);
    return out;
  }

  static void write_param(Engine& e, param_id p, std::span<const float> value, int writer) {
    e.check_between_steps("write_param()");
    engine_checks::param_id_in_range(e.spec_, p, "write_param");
    agree_on_write(e, p, state_field::working, value, writer, "write_param()");
    const float* v = e.world_comm().rank() == writer ? value.data() : nullptr;
    scatter_field(e, p, state_field::working, v, writer);
    if (e.spec_.param(p).trainable) scatter_field(e, p, state_field::master, v, writer);
  }

  static std::vector<float> gather_grad(Engine& e, param_id p) {
    e.rethrow_if_unusable();
    engine_checks::param_id_in_range(e.spec_, p, "gather_grad");  // a wrong id is wrong in any window
    ZSHARD_REQUIRE(e.scopes_.count() == 0 && e.tracker_.phase() == step_phase::forward &&
                       !training_controls<Engine>::counted_uses_pending(e) && e.micro_batches_ > 0,
                   error_kind::usage, "gather_grad() outside the window between end_backward() and step()",
                   "read gradients after a micro-batch's end_backward() and before step()");
    ZSHARD_REQUIRE(!e.ctl_.sync.holding(), error_kind::usage,
                   "gather_grad() while gradients are held unreduced (sync off)",
                   "read it after a micro-batch run with set_gradient_sync(true)");
    ZSHARD_REQUIRE(e.spec_.param(p).trainable, error_kind::usage,
                   "parameter '" + e.spec_.param(p).name + "' is frozen and has no gradient");
    if constexpr (offloader_with_grad_read<typename Engine::offloader_type>) {
      e.store_.streams().order(stream_role::compute, stream_role::reduce);  // the shards are complete
      std::vector<float> mine(e.store_[p].layout.shard_numel);
      e.offloader_.read_grad(p, mine.data());
      const float denom = float(e.micro_batches_) * e.scaler_.scale();
      for (float& x : mine) x /= denom;
      return gather_shards(e, p, mine.data(), dtype::f32);
    } else {
      throw error(error_kind::usage, "this engine's Offloader cannot read gradient shards",
                  "give it read_grad(param_id, float*); see offload/offloader.hpp");
    }
  }

  static std::vector<float> gather_optimizer_state(Engine& e, param_id p, state_field f) {
    e.check_between_steps("gather_optimizer_state()");
    engine_checks::param_id_in_range(e.spec_, p, "gather_optimizer_state");
    ZSHARD_REQUIRE(f != state_field::working, error_kind::usage, "the working value is not optimizer state",
                   "use gather_param() / write_param() for a parameter's value");
    return gather_field(e, p, f);
  }

  static void write_optimizer_state(Engine& e, param_id p, state_field f, std::span<const float> value, int writer) {
    e.check_between_steps("write_optimizer_state()");
    engine_checks::param_id_in_range(e.spec_, p, "write_optimizer_state");
    ZSHARD_REQUIRE(f == state_field::m || f == state_field::v, error_kind::usage,
                   "write_optimizer_state() writes m or v, not " + std::string(to_string(f)),
                   "write a value (working and master together) with write_param()");
    ZSHARD_REQUIRE(e.spec_.param(p).trainable, error_kind::usage,
                   "parameter '" + e.spec_.param(p).name + "' is frozen: it has no " + std::string(to_string(f)) +
                       " state",
                   "unfreeze it (set_trainable) first");
    agree_on_write(e, p, f, value, writer, "write_optimizer_state()");
    scatter_field(e, p, f, e.world_comm().rank() == writer ? value.data() : nullptr, writer);
  }

 private:
  enum problem : std::uint64_t { none, wrong_size, bad_moment };

  // One exchange: the same parameter, field and writer on every rank, and the writer's value of
  // the right size, and for a moment one that AdamW can use: m finite, v finite and not negative
  // (a negative v makes sqrt(v) NaN; a NaN or Inf moment makes the parameter NaN at the next
  // step, which is not an overflow the loss scaler would skip). The first bad element is named.
  // A writer outside the world is refused on every rank before it.
  static void agree_on_write(Engine& e, param_id p, state_field f, std::span<const float> value, int writer,
                             const std::string& what) {
    const int world = e.world_comm().size();
    ZSHARD_REQUIRE(writer >= 0 && writer < world, error_kind::usage,
                   what + ": writer rank " + std::to_string(writer) + " is not in a world of " + std::to_string(world));
    const std::size_t numel = e.store_[p].layout.numel;
    argument_problem bad;
    if (e.world_comm().rank() == writer) {
      if (value.size() != numel) {
        bad.code = wrong_size;
      } else if (f == state_field::m || f == state_field::v) {
        for (std::size_t i = 0; i < numel; ++i)
          if (!std::isfinite(value[i]) || (f == state_field::v && value[i] < 0.0f)) {
            bad = {bad_moment, i, std::bit_cast<std::uint32_t>(value[i])};
            break;
          }
      }
    }
    const std::string& name = e.spec_.param(p).name;
    e.agreement_.same_arguments(
        what, {p, std::uint64_t(f), std::uint64_t(writer)}, bad, [&](const argument_problem& q) -> std::string {
          if (q.code == wrong_size)
            return "(the writer) passed a value of the wrong size for '" + name + "' (" + std::to_string(numel) +
                   " elements expected)";
          const float x = std::bit_cast<float>(static_cast<std::uint32_t>(q.value));
          return std::string("(the writer) passed ") + (f == state_field::v ? "a v" : "an m") + " for '" + name +
                 "' whose element #" + std::to_string(q.detail) + " is " + format_number(x) +
                 (f == state_field::v ? ": a second moment must be finite and not negative"
                                      : ": a first moment must be finite");
        });
  }
};

}  // namespace zshard
