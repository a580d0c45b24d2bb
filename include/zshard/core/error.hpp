#pragma once
// One exception type for everything zshard reports, with a category that says what went
// wrong and a hint that says what to do about it. Callers that want to react to a kind of
// failure catch zshard::error and switch on kind(); everyone else just prints what().
#include <stdexcept>
#include <string>
#include <string_view>

namespace zshard {

enum class error_kind {
  config,     // a configuration value or model spec is invalid: fix the input
  usage,      // the engine's API was called out of order: fix the calling training loop
  budget,     // a memory ledger budget would be exceeded: raise the budget or shrink buckets
  comm,       // a collective failed, timed out, or a peer rank failed
  invariant,  // an internal invariant (I1-I8) was violated: a zshard bug or a misused policy
  backend,    // a backend call (CUDA, allocation) failed
  io,         // reading or writing a file failed
};

constexpr std::string_view to_string(error_kind k) noexcept {
  switch (k) {
    case error_kind::config: return "configuration error";
    case error_kind::usage: return "usage error";
    case error_kind::budget: return "memory budget exceeded";
    case error_kind::comm: return "communication error";
    case error_kind::invariant: return "invariant violated";
    case error_kind::backend: return "backend error";
    case error_kind::io: return "i/o error";
  }
  return "error";
}

class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& message, const std::string& hint = {})
      : std::runtime_error(compose(kind, message, hint)), kind_(kind), message_(message), hint_(hint) {}

  error_kind kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  const std::string& hint() const noexcept { return hint_; }

 private:
  static std::string compose(error_kind kind, const std::string& message, const std::string& hint) {
    std::string s = "zshard: ";
    s += to_string(kind);
    s += ": ";
    s += message;
    if (!hint.empty()) {
      s += " (how to fix: ";
      s += hint;
      s += ")";
    }
    return s;
  }

  error_kind kind_;
  std::string message_;
  std::string hint_;
};

// Throws a zshard::error of the given kind when `condition` is false. Used for checks that
// guard user input, so they stay on in release builds. A macro so that the message and hint
// are only built when the check fails: these checks sit on per-scope hot paths.
#define ZSHARD_REQUIRE(condition, ...)                                  \
  do {                                                                  \
    if (!(condition)) [[unlikely]] throw ::zshard::error(__VA_ARGS__); \
  } while (0)

}  // namespace zshard
