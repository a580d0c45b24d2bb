#pragma once
// Opt-in tags: a type states which zshard concept it means to satisfy with
// `using zshard_tag = zshard::<concept>_tag;`. Structural matches alone never count, so a type
// cannot satisfy a policy concept by accident, and a missing tag gets its own readable error.
#include <concepts>

namespace zshard {

struct partitioner_tag {};
struct prefetcher_tag {};
struct reducer_tag {};
struct offloader_tag {};
struct hook_tracker_tag {};

template <class T, class Tag>
concept opts_into = requires { typename T::zshard_tag; } && std::same_as<typename T::zshard_tag, Tag>;

}  // namespace zshard
