#pragma once
// One shape for every policy: a *family*, an empty tag type that opts into its concept
// (policy_tags.hpp) and names its implementation for a backend and a communicator:
//
//   struct my_reducer {
//     using zshard_tag = zshard::reducer_tag;
//     template <class Backend, class Comm> using impl = my_reducer_impl<Backend, Comm>;
//   };
//
// A policy that needs neither backend nor communicator names itself (`template <class, class>
// using impl = my_partitioner;`). The engine asks policy_impl_t for the implementation; a family
// without a usable `impl` yields no_impl instead of a hard error, so that the concept's check
// (check_partitioner() and its siblings) is what the user reads, not "no template named impl".
#include <concepts>
#include <type_traits>

#include "zshard/core/policy_tags.hpp"

namespace zshard {

// What policy_impl_t names when a family has no `impl` for the backend and communicator.
struct no_impl {};

template <class Family, class Backend, class Comm>
concept has_policy_impl = requires { typename Family::template impl<Backend, Comm>; };

template <class Family, class Backend, class Comm>
struct policy_impl {
  using type = no_impl;
};
template <class Family, class Backend, class Comm>
  requires has_policy_impl<Family, Backend, Comm>
struct policy_impl<Family, Backend, Comm> {
  using type = typename Family::template impl<Backend, Comm>;
};

template <class Family, class Backend, class Comm>
using policy_impl_t = typename policy_impl<Family, Backend, Comm>::type;

// A family derived from a self-naming policy inherits the base's `impl`, and would silently run
// as the base: the checks reject that (the derived family must name itself again).
template <class Family, class Backend, class Comm>
constexpr bool inherits_base_impl() {
  using impl = policy_impl_t<Family, Backend, Comm>;
  return std::is_class_v<impl> && std::is_base_of_v<impl, Family> && !std::is_same_v<impl, Family>;
}
// A family that opts into `Tag` and names an implementation: what the checks after the
// preamble below may look into.
template <class Family, class Tag, class Backend, class Comm>
inline constexpr bool policy_named = opts_into<Family, Tag> && has_policy_impl<Family, Backend, Comm>;

// The preamble of every policy's check (check_partitioner() and its siblings), one shape for
// all five: the family opts in with its tag, names its implementation, and does not inherit a
// self-naming base's impl. `a_who` names the policy in messages ("a Partitioner"), `who` alone
// ("Partitioner"). A macro because a static_assert's message must be a string literal.
#define ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, tag, a_who, who)                                          \
  static_assert(::zshard::opts_into<Family, ::zshard::tag>,                                                         \
                "zshard: " a_who " declares `using zshard_tag = zshard::" #tag ";`");                               \
  static_assert(!::zshard::opts_into<Family, ::zshard::tag> || ::zshard::has_policy_impl<Family, Backend, Comm>,    \
                "zshard: " a_who " names its implementation: `template <class Backend, class Comm> using impl = "   \
                "...;` (one that needs neither names itself)");                                                     \
  static_assert(!::zshard::policy_named<Family, ::zshard::tag, Backend, Comm> ||                                    \
                    !::zshard::inherits_base_impl<Family, Backend, Comm>(),                                         \
                "zshard: this " who " derives from a policy whose `impl` names the base, so it would run as the "   \
                "base; declare `template <class Backend, class Comm> using impl = <this type>;` in it")

// The placeholder backend and communicator a policy's own static_assert uses when its
// implementation does not depend on them.
struct any_backend {};
struct any_comm {};

}  // namespace zshard
