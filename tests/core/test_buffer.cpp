// Owning buffers and views: every byte charged while alive, returned on destruction or move.
#include <doctest/doctest.h>

#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/tensor_view.hpp"

using namespace zshard;

TEST_CASE("buffer: charged for its lifetime, moves transfer ownership") {
  host_backend b;
  {
    buffer<host_backend> x(b, dtype::bf16, 1001, mem_category::gathered_params);
    CHECK(x.bytes() == 2002);
    CHECK(b.ledger().current(mem_category::gathered_params) == 2002);
    buffer<host_backend> y = std::move(x);
    CHECK(!x);
    CHECK(y.numel() == 1001);
    CHECK(b.ledger().current(mem_category::gathered_params) == 2002);
    buffer<host_backend> z(b, dtype::f32, 10, mem_category::scratch);
    z = std::move(y);  // z's old allocation is returned
    CHECK(b.ledger().current(mem_category::scratch) == 0);
    CHECK(b.ledger().current(mem_category::gathered_params) == 2002);
  }
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().total_peak() == 2002 + 40);
}

TEST_CASE("buffer: an allocation refused by the budget leaves nothing behind") {
  host_backend b(1000);
  buffer<host_backend> a(b, dtype::f32, 200, mem_category::sharded_params);
  CHECK_THROWS_AS(buffer<host_backend>(b, dtype::f32, 100, mem_category::grad_buckets), error);
  CHECK(b.ledger().total_current() == 800);
}

TEST_CASE("shape and views") {
  CHECK(shape{3, 4, 5}.numel() == 60);
  CHECK(shape{}.numel() == 0);
  CHECK(shape{7}.to_string() == "[7]");
  CHECK_THROWS_AS((shape{3, 0}), error);
  CHECK_THROWS_AS((shape{1, 2, 3, 4, 5}), error);
  std::vector<float> data(12, 1.5f);
  mutable_view v(data.data(), dtype::f32, shape{3, 4});
  CHECK(v.numel() == 12);
  CHECK(v.bytes() == 48);
  CHECK(v.as<float>()[11] == 1.5f);
  CHECK_THROWS_AS(v.as<bf16>(), error);
  const_view cv = v;
  CHECK(cv.as<const float>().size() == 12);
}
