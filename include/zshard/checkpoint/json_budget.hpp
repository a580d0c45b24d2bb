#pragma once
// A budget for parsing JSON that a file holds: the deepest nesting and the most values (every
// scalar, array, object and key) the format can hold. A parse into a DOM costs memory per value
// and per level (a vector or map each: 20 MB of "[[[[..." once cost 1.5 GB), so the text is
// first walked with the SAX parser, which builds nothing and stops at the first value beyond
// the budget; only text within it is then parsed into a DOM.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace zshard::checkpoint {

struct json_budget {
  std::size_t max_depth = 0;     // nested arrays and objects: 1 for the outermost
  std::uint64_t max_values = 0;  // scalars, arrays, objects and object keys, all counted
};

// What json_within found: the first excess, or none (a syntax error is left to the DOM parse).
struct json_budget_excess {
  enum kind_t : std::uint8_t { none, depth, values } kind = none;
  explicit operator bool() const noexcept { return kind != none; }
  // `subject` nests too deep / holds too many values.
  std::string describe(const json_budget& b, const std::string& subject = "it") const {
    if (kind == depth)
      return subject + " nests arrays or objects deeper than the " + std::to_string(b.max_depth) +
             " levels its format has";
    return subject + " holds more than the " + std::to_string(b.max_values) +
           " values (keys, arrays, objects, scalars) its format can hold here";
  }
};

namespace detail {
class budget_walker {
 public:
  using json = nlohmann::json;
  explicit budget_walker(const json_budget& b) : b_(b) {}
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool key(json::string_t&) { return value(); }
  bool start_object(std::size_t) { return open(); }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  json_budget_excess excess{};

 private:
  bool value() {
    if (++values_ <= b_.max_values) return true;
    excess.kind = json_budget_excess::values;
    return false;
  }
  bool open() {
    if (!value()) return false;
    if (++depth_ <= b_.max_depth) return true;
    excess.kind = json_budget_excess::depth;
    return false;
  }
  bool close() {
    --depth_;
    return true;
  }
  json_budget b_;
  std::uint64_t values_ = 0;
  std::size_t depth_ = 0;
};
}  // namespace detail

// Walks `text` without building anything; the first value beyond budget `b`, or none.
inline json_budget_excess json_within(const std::string& text, const json_budget& b) {
  detail::budget_walker w(b);
  nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &w);
  return w.excess;
}

}  // namespace zshard::checkpoint
