#pragma once
// One shape for the to_string() of zshard's enums: each enumerator listed with its name, looked
// up; a value outside the list names itself "?".
//   constexpr std::string_view to_string(reduce_op op) noexcept {
//     return enum_name(op, {{reduce_op::sum, "sum"}, {reduce_op::average, "average"}, {reduce_op::max, "max"}});
//   }
#include <cstddef>
#include <string_view>
#include <utility>

namespace zshard {

template <class Name = std::string_view, class E, std::size_t N>
constexpr Name enum_name(E e, const std::pair<E, Name> (&names)[N]) noexcept {
  for (const auto& [value, name] : names)
    if (value == e) return name;
  return "?";
}

}  // namespace zshard
