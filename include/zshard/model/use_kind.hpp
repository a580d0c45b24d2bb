#pragma once
// What a forward use of a module is for; the HookTracker counts by it (I1) and the Prefetcher
// records it in its trace.
#include <cstdint>
#include <string_view>

#include "zshard/core/enum_name.hpp"

namespace zshard {

enum class use_kind : std::uint8_t {
  counted,    // a forward whose backward will run
  recompute,  // a checkpointed block's forward re-run during backward: gathers, never counts
  no_grad,    // evaluation, reference-model passes: gathers, never counts
};

constexpr std::string_view to_string(use_kind k) noexcept {
  return enum_name(k, {{use_kind::counted, "counted"}, {use_kind::recompute, "recompute"},
                       {use_kind::no_grad, "no_grad"}});
}

}  // namespace zshard
