#pragma once
// Offloader: where optimizer state (fp32 master, AdamW moments) and gradient shards live, and
// where the update runs. A policy is a family (core/policy_family.hpp): `template <class
// Backend, class Comm> using impl = ...;`. An implementation is constructed from
// (param_store&, Comm&, const optim::adamw_config&, const offload_config&) and provides:
//   init_param(p, values)        f32 initial values of p's shard (on the backend), trainable p only
//   accumulate_grad(p, g, n, s)  add a reduced gradient shard (on the backend, f32); called by the
//                                Reducer as buckets finish, so an offloader may stream it out.
//                                g is ready in the order of stream s (the reduce stream): read it
//                                with work enqueued on s (or synchronize s), since the Reducer
//                                frees g on s right after
//   (local_grad_stats, update and discard_grads run on the compute stream, which the engine has
//   ordered after the reduce stream; update's writes to the working shards are ordered before
//   the next gathers by the engine as well)
//   local_grad_stats()           sum of squares and an Inf/NaN flag over the gradients this rank
//                                owns (a replicated parameter counts on rank 0 only), so that the
//                                engine can all-reduce them into a global norm and overflow flag
//   update(args)                 AdamW over every trainable shard, writes the working shards,
//                                zeroes the gradients
//   discard_grads()              zero the gradients without updating (a skipped step)
//   state_ledger()               the ledger charged for optimizer state (the backend's, or a
//                                host ledger when state lives on the host)
#include <concepts>
#include <cstdint>

#include "zshard/backend/backend.hpp"
#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/offload/offload_config.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/param_groups.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard {

struct update_args {
  std::int64_t step = 1;   // 1-based optimizer step (bias correction)
  float lr = 0.0f;         // when groups is null: every parameter's learning rate
  float grad_scale = 1.0f;  // multiplies the accumulated gradient: clip / (micro-batches * loss scale)
  // Learning rate and weight decay per parameter group (optim/param_groups.hpp); null: lr above
  // and adamw_config's weight decay for every parameter.
  const optim::param_groups* groups = nullptr;
};

// Optional capabilities (the engine checks for them where they are used, and says which is
// missing when a feature needs it; both in-tree Offloaders have all of them):
//   local_grad_norm_part(t) -> double   this rank's part of the L1 (sum |g|) or L-inf (max |g|)
//                                       norm of its gradient shards (engine/grad_norm.hpp)
//   set_trainable(p, bool)              a parameter is frozen or unfrozen between steps: its
//                                       state (and update count) is kept when frozen; created
//                                       when first unfrozen (master from the working shard,
//                                       m = v = 0, update count 0). On unfreezing, the engine
//                                       then sets the master where the working value was
//                                       written while frozen (through read_state/write_state)
//   has_state(p) -> bool                p has optimizer state: trainable now, or frozen with the
//                                       state it kept. With it, state access (read_state /
//                                       write_state) reaches a frozen parameter's kept state and
//                                       checkpoints save and restore it; without it, a frozen
//                                       parameter's state is not saved (a load then starts it over)
//   can_add_state(p) -> bool            state can be created for p now (set_trainable(p, true)
//                                       would not refuse for lack of room); a checkpoint load
//                                       that must create a frozen parameter's state asks first
//   read_grad(p, float* host)           p's accumulated gradient shard (shard_numel f32) into
//                                       host memory, complete on return (zeros when none arrived)
// An Offloader applies update_args::groups (per-group learning rate and weight decay) when it
// says so (`static constexpr bool applies_param_groups = true;`); the engine refuses
// engine_config::param_groups otherwise, rather than train every group at the default rate.
template <class O>
concept offloader_with_param_groups = requires { requires O::applies_param_groups; };
template <class O>
concept offloader_with_trainability = requires(O& o, param_id p) { o.set_trainable(p, true); };
template <class O>
concept offloader_with_grad_read = requires(O& o, param_id p, float* dst) { o.read_grad(p, dst); };

template <class O, class Stream>
concept offloader = requires(O& o, param_id p, const float* g, std::size_t n, Stream& s, const update_args& a) {
  o.init_param(p, g);
  o.accumulate_grad(p, g, n, s);
  { o.local_grad_stats() } -> std::same_as<grad_stats>;
  o.update(a);
  o.discard_grads();
  { o.state_ledger() } -> std::same_as<const memory_ledger&>;
};

// The engine checks its Offloader family for its backend and communicator.
template <class Family, class Backend, class Comm>
constexpr bool check_offloader() {
  ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, offloader_tag, "an Offloader policy", "Offloader policy");
  constexpr bool named = policy_named<Family, offloader_tag, Backend, Comm>;
  using impl = policy_impl_t<Family, Backend, Comm>;
  static_assert(!named || std::constructible_from<impl, param_store<Backend>&, Comm&,
                                                              const optim::adamw_config&, const offload_config&>,
                "zshard: an Offloader implementation is constructible from (param_store<Backend>&, Comm&, "
                "const optim::adamw_config&, const offload_config&)");
  static_assert(!named || offloader<impl, typename Backend::stream>,
                "zshard: the Offloader implementation does not provide init_param, accumulate_grad, "
                "local_grad_stats, update, discard_grads and state_ledger; see offload/offloader.hpp");
  return true;
}

}  // namespace zshard
