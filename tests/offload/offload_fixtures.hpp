#pragma once
// What the offload tests share: a host backend that claims device memory, and the bitwise
// comparison of two trainings' parameters.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "../engine/toy_training.hpp"
#include "zshard/backend/host_backend.hpp"

namespace offload_test {

// A host backend that claims its memory is device memory: the offloader then streams gradients
// and the working values of device-resident parameters through its staging halves, as on a GPU.
struct device_like_backend : zshard::host_backend {
  using zshard::host_backend::host_backend;
  static constexpr bool memory_is_host = false;
};

// Every parameter of `got` equals `want`'s bit for bit, and both ran as many steps.
inline void check_same_params(const toy::train_result& got, const toy::train_result& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t p = 0; p < got.params.size(); ++p) {
    INFO("parameter #" << p);
    REQUIRE(got.params[p].size() == want.params[p].size());
    CHECK(std::memcmp(got.params[p].data(), want.params[p].data(), got.params[p].size() * sizeof(float)) == 0);
  }
  REQUIRE(got.reports.size() == want.reports.size());
}

}  // namespace offload_test
