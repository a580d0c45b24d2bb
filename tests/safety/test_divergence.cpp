// Issue 11, points 1 and 7: ranks that run different schedules are caught before any mixed
// data reaches the parameters, on a communicator that carries tags (threads) at the first
// collective that differs, and on one that cannot (as NCCL) at step(), or at the scope in
// checked mode; settings that shape the schedule are compared at construction; a skipped
// call and a rank that returns early fail at once with messages that name them.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>

#include "../support/early_return.hpp"
#include "stack_model.hpp"

using namespace safety;
using namespace std::chrono_literals;

namespace {

std::vector<schedule> same(int world, std::vector<module_id> fwd) {
  std::vector<schedule> s(static_cast<std::size_t>(world));
  for (auto& x : s) x.forward = fwd;
  return s;
}

}  // namespace

TEST_CASE("same schedules train (control: the divergence tests below can tell the two apart)") {
  const model_spec spec = stack_spec(3, 2);
  for (int world : {2, 3}) {
    const auto t = run_schedules<true>(spec, same(world, {0, 1, 2, 3}));
    CHECK_FALSE(t.error);
    const auto u = run_schedules<false>(spec, same(world, {0, 1, 2, 3}));
    CHECK_FALSE(u.error);
    for (int r = 0; r < world; ++r) CHECK((t.trained[std::size_t(r)] && u.trained[std::size_t(r)]));
  }
}

TEST_CASE("threads: two ranks gathering different same-size blocks fail at that gather, naming rank, module and scope") {
  const model_spec spec = stack_spec(3, 2);
  auto s = same(2, {0, 1, 2});
  s[1].forward = {0, 2, 1};  // rank 1 runs blocks 1 and 2 in the other order
  const auto o = run_schedules<true>(spec, s);
  o.check_error_says({"ranks diverged", "scope #2 of module 1", "scope #2 of module 2", "rank 1", "module '"});
  CHECK(o.trained == std::vector<int>{0, 0});
}

TEST_CASE("as NCCL (no tags): a routing difference is caught at step() before the optimizer, naming the scope") {
  const model_spec spec = stack_spec(2, 3);
  auto s = same(3, {0, 2, 1});  // b0, e0, b1
  s[2].forward = {0, 3, 1};     // rank 2 routes to e1
  const auto o = run_schedules<false>(spec, s);
  o.check_error_says({"ranks ran different schedules", "diverged at scope #2",
                      "rank 0 ran forward (counted) of module 'e0'", "rank 2 ran forward (counted) of module 'e1'"});
  CHECK(o.trained == std::vector<int>{0, 0, 0});
}

TEST_CASE("as NCCL, checked mode: caught at the scope itself, before its gathers") {
  const model_spec spec = stack_spec(2, 3);
  auto s = same(2, {0, 2, 1});
  s[1].forward = {0, 3, 1};
  for (auto& x : s) x.cfg.check_every_scope = true;
  const auto o = run_schedules<false>(spec, s);
  o.check_error_says({"found at the scope check", "diverged at scope #2"});
  CHECK(o.trained == std::vector<int>{0, 0});
}

TEST_CASE("every schedule-shaping setting is compared at construction, and the one that differs is named") {
  const model_spec spec = stack_spec(2, 0);
  struct variant {
    const char* name;
    void (*change)(engine_config&);
  };
  const variant variants[] = {
      {"prefetch.prefetch_numel", [](engine_config& c) { c.prefetch.prefetch_numel = 100; }},
      {"prefetch.max_live_numel", [](engine_config& c) { c.prefetch.max_live_numel = 5000; }},
      {"prefetch.max_reuse_distance", [](engine_config& c) { c.prefetch.max_reuse_distance = 64; }},
      {"reduce.reduce_bucket_numel", [](engine_config& c) { c.reduce.reduce_bucket_numel = 1000; }},
      {"partition.persistence_threshold_numel", [](engine_config& c) { c.partition.persistence_threshold_numel = 9; }},
      {"partition.shard_alignment_numel", [](engine_config& c) { c.partition.shard_alignment_numel = 4; }},
      {"prefetch.allow_oversized_module", [](engine_config& c) { c.prefetch.allow_oversized_module = true; }},
      {"check_every_scope", [](engine_config& c) { c.check_every_scope = true; }},
  };
  for (const auto& v : variants) {
    auto s = same(3, {0, 1});
    v.change(s[1].cfg);
    const auto o = run_schedules<true>(spec, s);
    o.check_error_says({std::string("ranks disagree on ") + v.name});
    CHECK(o.trained == std::vector<int>{0, 0, 0});
  }
}

// Issue 25 point 11: each setting reads as its own type (a double's value, not its bits; a
// dtype's name; a flag; a hash in hex), whatever the first rank that differs.
TEST_CASE("a setting the ranks disagree on is printed as its value, in its own type") {
  const model_spec spec = stack_spec(2, 0);
  struct variant {
    void (*change)(engine_config&);
    const char* text;
  };
  const variant variants[] = {
      {[](engine_config& c) { c.clip_norm_type = 1.0; },
       "ranks disagree on clip_norm_type: rank 0 has 2, rank 2 has 1"},
      {[](engine_config& c) { c.clip_norm_type = INFINITY; },
       "ranks disagree on clip_norm_type: rank 0 has 2, rank 2 has inf"},
      {[](engine_config& c) { c.clip_norm = 0.25; }, "ranks disagree on clip_norm: rank 0 has 0, rank 2 has 0.25"},
      {[](engine_config& c) { c.param_dtype = dtype::f16; },  // stack_config: bf16
       "ranks disagree on param_dtype: rank 0 has bf16, rank 2 has f16"},
      {[](engine_config& c) { c.check_every_scope = true; },
       "ranks disagree on check_every_scope: rank 0 has false, rank 2 has true"},
      {[](engine_config& c) { c.prefetch.max_live_numel = 5000; },
       "ranks disagree on prefetch.max_live_numel: rank 0 has 1000000000, rank 2 has 5000"},
  };
  for (const auto& v : variants) {
    auto s = same(3, {0, 1});
    v.change(s[2].cfg);
    const auto o = run_schedules<true>(spec, s);
    REQUIRE(o.error);
    INFO(*o.error);
    CHECK(contains(*o.error, v.text));
  }
  // hashes (the model, the layouts, the parameter groups) read as hashes
  auto s = same(2, {0, 1});
  s[1].cfg.param_groups = {{.name = "g", .params = {"b0.w"}, .lr = 5e-3f}};
  const auto o = run_schedules<true>(spec, s);
  REQUIRE(o.error);
  INFO(*o.error);
  CHECK(contains(*o.error, "ranks disagree on param_groups (names and members): rank 0 has hash 0x"));
}

TEST_CASE("thread_comm: a skipped call between same-size collectives is caught by the tags") {
  std::string msg;
  try {
    run_ranks(2, [](thread_comm& c) {
      float src[4] = {1, 2, 3, 4}, dst[8];
      const collective_tag a{collective_use::gather, 3, 7, 5, 11}, b{collective_use::gather, 4, 9, 6, 12};
      if (c.rank() == 0) c.all_gather(src, dst, 4, dtype::f32, {}, a);  // rank 1 skips this one
      c.all_gather(src, dst, 4, dtype::f32, {}, b);
    });
  } catch (const error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(contains(msg, "ranks diverged"));
  CHECK(contains(msg, "rank 0 called all_gather(count=4, f32) for gather in scope #5 of module 3, parameter 7"));
  CHECK(contains(msg, "rank 1 called all_gather(count=4, f32) for gather in scope #6 of module 4, parameter 9"));
}

TEST_CASE("a rank that returns early from run_ranks fails the others at once, naming it") {
  for (bool untagged_skip : {false, true}) {
    const auto [msg,
                waited] = test_support::run_with_early_return("untagged skip " + std::to_string(untagged_skip), [&] {
      run_ranks(
          3,
          [&](thread_comm& c) {
            float x[2] = {1, 2}, y[6];
            c.all_gather(x, y, 2, dtype::f32);
            if (c.rank() == 1) return;  // returns (or skips its last call) without an error
            if (untagged_skip) c.all_gather(x, y, 2, dtype::f32);
            c.barrier();
          },
          std::chrono::milliseconds(30'000));
    });
    INFO(msg);
    CHECK(contains(msg, "rank 1 returned from its run_ranks function after 1 collective(s)"));
    CHECK(waited < 10s);  // not the 30 s timeout
  }
}
