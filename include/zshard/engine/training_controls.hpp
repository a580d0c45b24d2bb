#pragma once
// What a training stack changes between steps and micro-batches, and the boundary of a
// forward-only pass (the engine's public calls forward here; see README "Parameter groups,
// freezing, no-sync" and "Inference and reference models"):
//
//   end_pass()                              ends a forward-only pass (inference, generation, a
//                                           frozen reference model): the boundary step() is for
//                                           training. The Prefetcher's trace closes (the first
//                                           pass records it, later ones replay it and gather
//                                           ahead), everything gathered is released, nothing
//                                           grows from pass to pass. Not collective.
//   set_trainable(p, on)                    freeze / unfreeze between steps (as requires_grad_);
//                                           unfrozen, p trains from its working value as
//                                           written while it was frozen (load, write_param)
//   set_gradient_sync(on)                   between micro-batches (engine/grad_sync.hpp)
//   set_keep_gathered_until_backward(m, on) between steps: m stays gathered from its counted
//                                           forward to its backward (FSDP's
//                                           reshard_after_forward=False), as a preferred hold
//                                           that yields to max_live_numel (engine/residency.hpp)
// The last three decide which collectives run, so they are collective: every rank calls them
// with the same arguments, and the engine checks that the ranks agree (one exchange,
// rank_agreement::same_arguments) before anything changes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/engine/engine_checks.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/engine/grad_norm.hpp"
#include "zshard/engine/grad_sync.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/param_groups.hpp"
#include "zshard/state/state_access.hpp"
#include "zshard/state/stream_roles.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard {

// The engine's state for these controls.
struct training_control_state {
  training_control_state(const model_spec& spec, const std::vector<optim::param_group>& groups,
                         const optim::adamw_config& adamw)
      : groups(spec, groups, adamw), sync(spec.params().size()), keep_after_forward(spec.modules().size(), false) {
    trainable.reserve(spec.params().size());
    for (const auto& p : spec.params()) trainable.push_back(p.trainable);
  }

  optim::param_groups groups;
  grad_sync sync;
  std::vector<bool> keep_after_forward;  // per module: set_keep_gathered_until_backward
  std::vector<std::uint8_t> trainable;   // per parameter: the spec's flag, a byte (read per backward scope)
  std::int64_t passes = 0;               // end_pass() calls
  std::int64_t scopes_since_boundary = 0;  // scopes since the last step() or end_pass()
};

template <class Engine>
class training_controls {
 public:
  // A Prefetcher that records until a boundary grows with every scope: said once, at this many.
  static constexpr std::int64_t warn_scopes = std::int64_t(1) << 22;

  // At construction: what the configuration asks of the Offloader, it has.
  static void check_supported(const engine_config& cfg) {
    using O = typename Engine::offloader_type;
    check_norm_type_supported<O>(cfg.clip_norm_type);
    if constexpr (!offloader_with_param_groups<O>)
      ZSHARD_REQUIRE(cfg.param_groups.empty(), error_kind::config,
                     "this engine's Offloader does not apply parameter groups (engine_config::param_groups)",
                     "leave param_groups empty, or apply update_args::groups in the Offloader's update() and declare "
                     "`static constexpr bool applies_param_groups = true;`");
  }

  static void end_pass(Engine& e) {
    e.rethrow_if_unusable();
    ZSHARD_REQUIRE(e.scopes_.count() == 0, error_kind::usage,
                   "end_pass() with " + std::to_string(e.scopes_.count()) + " module scope(s) still open");
    ZSHARD_REQUIRE(e.tracker_.phase() == step_phase::forward && e.micro_batches_ == 0 && !counted_uses_pending(e),
                   error_kind::usage,
                   "end_pass() inside a training step (a backward ran or a counted forward awaits one)",
                   "end a training step with step(); run forward-only passes with forward(m, use_kind::no_grad)");
    e.ctl_.scopes_since_boundary = 0;
    ++e.ctl_.passes;
    e.fp_.on_event(schedule_event::end_pass);
    e.fp_.start_step();  // the pass's scope history ends here, as a step's does
    e.prefetcher_.on_step();
    e.residency_.release_unpinned();
    e.check(e.store_.gathered_set().empty(), "parameters still gathered after end_pass()");
  }

  // Every scope: a loop that never reaches a boundary is told once why memory grows.
  static void count_scope(Engine& e) {
    if (++e.ctl_.scopes_since_boundary == warn_scopes)
      e.cfg_.say("no step() or end_pass() for " + std::to_string(warn_scopes) +
                 " scopes: the Prefetcher's trace grows with every scope until one; end each forward-only pass "
                 "with end_pass()");
  }

  // A frozen parameter gets no gradient and no update; its optimizer state and update count are
  // kept, and created (master from its value, m = v = 0, count 0) the first time a parameter
  // frozen from the start is unfrozen. Unfreezing, the master follows the working value where it
  // was written while frozen (master_follows_working).
  static void set_trainable(Engine& e, param_id p, bool trainable) {
    e.check_between_steps("set_trainable()");
    engine_checks::param_id_in_range(e.spec_, p, "set_trainable");
    e.agreement_.same_arguments("set_trainable()", {p, trainable ? 1u : 0u});
    if (e.spec_.param(p).trainable == trainable) return;
    if constexpr (offloader_with_trainability<typename Engine::offloader_type>) {
      e.offloader_.set_trainable(p, trainable);  // first: it may fail (a budget), then nothing changed
      if (trainable) {
        try {
          master_follows_working(e, p);
        } catch (...) {
          e.offloader_.set_trainable(p, false);  // frozen again, as the spec still says
          throw;
        }
      }
    } else {
      throw error(error_kind::usage, "this engine's Offloader cannot freeze or unfreeze parameters",
                  "give it set_trainable(param_id, bool); see offload/offloader.hpp");
    }
    e.spec_.set_trainable(p, trainable);
    e.ctl_.trainable[p] = trainable;
    if constexpr (requires { e.tracker_.on_set_trainable(p, trainable); }) e.tracker_.on_set_trainable(p, trainable);
  }

  // Whether p has optimizer state (master, m, v): trainable now, or frozen with the state it kept.
  // An Offloader without has_state (offloader.hpp): trainable parameters only.
  static bool has_optimizer_state(const Engine& e, param_id p) {
    engine_checks::param_id_in_range(e.spec_, p, "has_optimizer_state");
    if constexpr (requires { e.offloader_.has_state(p); })
      return e.offloader_.has_state(p);
    else
      return e.spec_.param(p).trainable;
  }
  static bool can_add_optimizer_state(const Engine& e, param_id p) {
    if (has_optimizer_state(e, p)) return true;
    if constexpr (requires { e.offloader_.has_state(p); } && offloader_with_trainability<typename Engine::offloader_type>) {
      if constexpr (requires { e.offloader_.can_add_state(p); }) return e.offloader_.can_add_state(p);
      return true;
    } else {
      return false;
    }
  }
  // Gives frozen p the state a first unfreeze creates (master from its working value, m = v = 0,
  // update count 0) and leaves it frozen: a checkpoint load then writes the state it saved. Per
  // rank, between steps.
  static void add_optimizer_state(Engine& e, param_id p) {
    e.check_between_steps("add_optimizer_state()");
    if (has_optimizer_state(e, p)) return;
    ZSHARD_REQUIRE(can_add_optimizer_state(e, p), error_kind::usage,
                   "frozen parameter '" + e.spec_.param(p).name + "' cannot be given optimizer state by this Offloader",
                   "build the engine with the parameter trainable and freeze it (set_trainable) afterwards");
    if constexpr (offloader_with_trainability<typename Engine::offloader_type>) {
      e.offloader_.set_trainable(p, true);
      e.offloader_.set_trainable(p, false);
    }
  }

  // While p was frozen only its working value could be written (write_param, write_shard, a
  // checkpoint load of a parameter whose state the checkpoint lacks), so the master kept from
  // before the freeze is stale wherever the working value changed. Where the working value is not the
  // master's rounding to p's dtype, the master becomes the working value widened to f32; elsewhere
  // it keeps its f32 precision. m, v and the update count stay, as torch.optim keeps a parameter's
  // state when its value is replaced. One pass over the shard, through host memory, per unfreeze.
  static void master_follows_working(Engine& e, param_id p) {
    using O = typename Engine::offloader_type;
    if constexpr (Engine::backend_type::holds_storage && state_accessible<O>) {
      const auto& s = e.store_[p];
      const std::size_t n = s.layout.shard_numel, w = size_of(s.type);
      std::vector<std::byte> working(n * w), rounded(n * w);
      std::vector<float> master(n), widened(n);
      e.read_shard(p, state_field::working, 0, working.data(), n);  // wherever it lives (host memory when offloaded)
      e.offloader_.read_state(p, state_field::master, 0, master.data(), n);
      convert(master.data(), dtype::f32, rounded.data(), s.type, n);
      convert(working.data(), s.type, widened.data(), dtype::f32, n);
      bool changed = false;
      for (std::size_t i = 0; i < n; ++i)
        if (std::memcmp(working.data() + i * w, rounded.data() + i * w, w) != 0) {
          master[i] = widened[i];
          changed = true;
        }
      if (changed) e.offloader_.write_state(p, state_field::master, 0, master.data(), n);
    }
  }

  static void set_gradient_sync(Engine& e, bool on) {
    e.rethrow_if_unusable();
    ZSHARD_REQUIRE(e.scopes_.count() == 0 && e.tracker_.phase() == step_phase::forward && !counted_uses_pending(e),
                   error_kind::usage, "set_gradient_sync() inside a micro-batch", "call it before its first forward");
    e.agreement_.same_arguments("set_gradient_sync()", {on ? 1u : 0u});
    e.ctl_.sync.set(on);
  }

  static void set_keep_gathered_until_backward(Engine& e, module_id m, bool keep) {
    e.check_between_steps("set_keep_gathered_until_backward()");
    engine_checks::module_id_in_range(e.spec_, m, "set_keep_gathered_until_backward");
    e.agreement_.same_arguments("set_keep_gathered_until_backward()", {m, keep ? 1u : 0u});
    e.ctl_.keep_after_forward[m] = keep;
  }

  // After a scope of m closes: whether m stays gathered under a preferred hold (kept until its
  // backward, or the HookTracker's own preference).
  static bool prefers_gathered(const Engine& e, module_id m) {
    bool prefer = e.ctl_.keep_after_forward[m] && e.tracker_.pending_uses(m) > 0;
    if constexpr (requires { e.tracker_.prefers_gathered(m); }) prefer = prefer || e.tracker_.prefers_gathered(m);
    return prefer;
  }

  static bool counted_uses_pending(const Engine& e) {
    for (module_id m = 0; m < e.spec_.modules().size(); ++m)
      if (e.tracker_.pending_uses(m) != 0) return true;
    return false;
  }
};

}  // namespace zshard
