#pragma once
// Runs a callable expected to throw zshard::error and returns what it threw, so tests can
// assert on the error's kind and message; a call that does not throw fails the test.
#include <doctest/doctest.h>

#include <string>

#include "zshard/core/error.hpp"

namespace test_support {

template <class F>
zshard::error_kind kind_of(F&& f) {
  try {
    f();
  } catch (const zshard::error& e) {
    return e.kind();
  }
  FAIL("expected a zshard::error");
  return zshard::error_kind::invariant;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const zshard::error& e) {
    return e.what();
  }
  FAIL("expected a zshard::error");
  return {};
}

}  // namespace test_support
