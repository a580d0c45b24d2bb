#pragma once
// Runs a callable expected to throw zshard::error and returns what it threw, so tests can
// assert on the error's kind and message; a call that does not throw fails the test.
#include <doctest/doctest.h>

#include <string>

#include "zshard/core/error.hpp"

namespace test_support {

// The zshard::error f() throws (an invariant error saying so, and a failed test, when none).
template <class F>
zshard::error thrown_by(F&& f) {
  try {
    f();
  } catch (const zshard::error& e) {
    return e;
  }
  FAIL("expected a zshard::error");
  return zshard::error(zshard::error_kind::invariant, "no error was thrown");
}

template <class F>
zshard::error_kind kind_of(F&& f) {
  return thrown_by(f).kind();
}

template <class F>
std::string message_of(F&& f) {
  return thrown_by(f).what();
}

}  // namespace test_support
