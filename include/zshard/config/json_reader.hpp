#pragma once
// Typed reads of JSON values for config importers: each read names the key it reads, so a
// value of the wrong type or out of range becomes a zshard::error (config) that says which key,
// what it holds and what it should hold. "auto" (a string the Hugging Face Trainer fills in)
// reads as "no value" where a key may take it.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard::config {

class json_reader {
 public:
  explicit json_reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what, const std::string& hint = {}) const {
    throw error(error_kind::config, source_ + ": " + key + " " + what, hint);
  }

  static bool is_auto(const nlohmann::ordered_json& v) {
    return v.is_string() && v.get_ref<const std::string&>() == "auto";
  }

  void require_object(const nlohmann::ordered_json& v, const std::string& key) const {
    if (!v.is_object()) fail(key.empty() ? "the top level" : key, "must be a JSON object, got " + show(v));
  }

  // A whole number in [min, max]; 5e8 and 500000000.0 count as whole. nullopt: "auto".
  std::optional<std::uint64_t> count(const nlohmann::ordered_json& v, const std::string& key, std::uint64_t min,
                                     std::uint64_t max) const {
    if (is_auto(v)) return std::nullopt;
    const std::string range = "a whole number in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    if (!v.is_number() || v.is_boolean()) fail(key, "must be " + range + " or \"auto\", got " + show(v));
    if (v.is_number_unsigned()) {
      const auto n = v.get<std::uint64_t>();
      if (n < min || n > max) fail(key, "= " + std::to_string(n) + " is out of range: must be " + range);
      return n;
    }
    if (v.is_number_integer()) {
      const auto n = v.get<std::int64_t>();
      if (n < 0 || std::uint64_t(n) < min || std::uint64_t(n) > max)
        fail(key, "= " + std::to_string(n) + " is out of range: must be " + range);
      return std::uint64_t(n);
    }
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      fail(key, "= " + v.dump() + " is not a whole number: must be " + range);
    if (d < double(min) || d > double(max)) fail(key, "= " + v.dump() + " is out of range: must be " + range);
    return std::uint64_t(d);
  }

  // A finite number in [min, max]. nullopt: "auto".
  std::optional<double> number(const nlohmann::ordered_json& v, const std::string& key, double min, double max,
                               const std::string& expected) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_number() || v.is_boolean()) fail(key, "must be " + expected + " or \"auto\", got " + show(v));
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < min || d > max) fail(key, "= " + v.dump() + " is out of range: must be " + expected);
    return d;
  }

  // true or false. nullopt: "auto".
  std::optional<bool> boolean(const nlohmann::ordered_json& v, const std::string& key) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_boolean()) fail(key, "must be true or false, got " + show(v));
    return v.get<bool>();
  }

  std::string string(const nlohmann::ordered_json& v, const std::string& key) const {
    if (!v.is_string()) fail(key, "must be a string, got " + show(v));
    return v.get<std::string>();
  }

 private:
  static std::string show(const nlohmann::ordered_json& v) {
    std::string d = v.dump();
    if (d.size() > 40) d = d.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + d;
  }

  std::string source_;
};

}  // namespace zshard::config
