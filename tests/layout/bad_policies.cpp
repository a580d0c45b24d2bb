// Policies written wrong in each way a user can, one per ZSHARD_BAD_CASE value. Each case must
// fail to compile with zshard's own message for that mistake (tests/CMakeLists.txt compiles
// every case with -fsyntax-only and matches the message), never only with template noise such
// as "no class template named impl". Case 0 is the control: it must compile.
#include <tuple>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "../support/policies.hpp"
#include "../support/impl_family.hpp"
#include "../support/replicate_all.hpp"

#ifndef ZSHARD_BAD_CASE
#define ZSHARD_BAD_CASE 0
#endif

namespace bad {

using namespace zshard;

// Right: every policy of this file starts from one of these and breaks one thing.
using good_partitioner = test_support::replicate_all;

// A policy without its tag, of a class-template implementation; one with only its tag.
template <template <class, class> class Impl>
struct untagged {
  template <class Backend, class Comm>
  using impl = Impl<Backend, Comm>;
};
template <class Tag>
struct implless {
  using zshard_tag = Tag;
};

struct untagged_partitioner {  // 1: missing tag
  template <class Backend, class Comm>
  using impl = untagged_partitioner;
  shard_layout layout(const param_identity&, int, const partition_config&) const { return {}; }
};
struct implless_partitioner {  // 2: missing impl
  using zshard_tag = partitioner_tag;
  shard_layout layout(const param_identity&, int, const partition_config&) const { return {}; }
};
struct misshapen_partitioner {  // 3: wrong signature
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = misshapen_partitioner;
  shard_layout layout(const param_identity&, int) const { return {}; }
};
struct derived_partitioner : good_partitioner {};  // 4: inherits the base's self-naming impl

struct untagged_prefetcher : prefetch::on_demand {  // 5
  using zshard_tag = void;
};
using implless_prefetcher = implless<prefetcher_tag>;  // 6
struct misshapen_prefetcher {  // 7: the pre-house reset(spec, layouts, engine_config)
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = misshapen_prefetcher;
  void reset(const model_spec&, const std::vector<shard_layout>&, const engine_config&) {}
  void on_scope_enter(module_id, use_kind, std::vector<param_id>&) {}
  bool keep_after_scope(param_id) const { return false; }
  void on_step() {}
};

using untagged_reducer = untagged<reduce::bucketed_reducer>;  // 8
using implless_reducer = implless<reducer_tag>;               // 9
template <class Backend, class Comm>
struct reducer_without_flush {  // 10
  reducer_without_flush(param_store<Backend>&, Comm&, const reduce_config&) {}
  template <class Sink>
  void grad_ready(param_id, Sink&) {}
  std::size_t pending_numel() const { return 0; }
};
using misshapen_reducer = test_support::family<reducer_tag, reducer_without_flush>;

using untagged_offloader = untagged<offload::on_device_impl>;  // 11
using implless_offloader = implless<offloader_tag>;            // 12
template <class Backend, class Comm>
struct offloader_with_old_constructor : offload::on_device_impl<Backend, Comm> {  // 13
  offloader_with_old_constructor(param_store<Backend>& s, Comm& c, const engine_config& cfg)
      : offload::on_device_impl<Backend, Comm>(s, c, cfg.adamw, cfg.offload) {}
};
using misshapen_offloader = test_support::family<offloader_tag, offloader_with_old_constructor>;

struct untagged_tracker : track::use_counter {  // 14
  using zshard_tag = int;
  template <class Backend, class Comm>
  using impl = untagged_tracker;
};
using implless_tracker = implless<hook_tracker_tag>;  // 15
struct misshapen_tracker : track::use_counter {  // 16: on_forward must say whether it counted
  template <class Backend, class Comm>
  using impl = misshapen_tracker;
  void on_forward(module_id, use_kind) {}
};

struct not_a_backend {};                        // 17
struct not_a_comm {};                           // 18
struct not_policies {};                         // 19

// Case k's policies: the defaults with one policy swapped (cases 17-19 break something else).
using namespace test_support;
using case_policies = std::tuple_element_t<
    ZSHARD_BAD_CASE,
    std::tuple<with_partitioner<good_partitioner>,  // 0
               with_partitioner<untagged_partitioner>, with_partitioner<implless_partitioner>,
               with_partitioner<misshapen_partitioner>, with_partitioner<derived_partitioner>,
               with_prefetcher<untagged_prefetcher>, with_prefetcher<implless_prefetcher>,
               with_prefetcher<misshapen_prefetcher>,  // 5-7
               with_reducer<untagged_reducer>, with_reducer<implless_reducer>, with_reducer<misshapen_reducer>,
               with_offloader<untagged_offloader>, with_offloader<implless_offloader>,
               with_offloader<misshapen_offloader>,  // 11-13
               with_hook_tracker<untagged_tracker>, with_hook_tracker<implless_tracker>,
               with_hook_tracker<misshapen_tracker>,  // 14-16
               default_policies, default_policies, default_policies>>;

#if ZSHARD_BAD_CASE == 17
using backend_type = not_a_backend;
#else
using backend_type = host_backend;
#endif
#if ZSHARD_BAD_CASE == 18
using comm_type = not_a_comm;
#else
using comm_type = thread_comm;
#endif
#if ZSHARD_BAD_CASE == 19
using policies_type = not_policies;
#else
using policies_type = case_policies;
#endif

// Naming the class's size instantiates it, and with it the engine's checks.
inline constexpr std::size_t engine_size = sizeof(engine<backend_type, comm_type, policies_type>);

}  // namespace bad

int main() { return bad::engine_size > 0 ? 0 : 1; }
