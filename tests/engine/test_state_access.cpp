// State access (issue 19, point 4): a parameter's full value, gradient and optimizer state
// across ranks, as collective calls bounded by one parameter. Checked against the float64
// reference (feature_training.hpp) and against each other, with both Offloaders, with
// parameters that are sharded unevenly and replicated, and with bad calls failing on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "feature_training.hpp"

using namespace zshard;
using test_support::kind_of;
using test_support::message_of;

namespace {

using host_offload = test_support::host_offload_policies;

// The reference's gradient of the first step, mean over the global batch (float64).
std::vector<std::vector<double>> reference_first_grads(const toy::train_options& o) {
  toy::ids id;
  const auto spec = toy::make_spec(o.model, id);
  const auto& ps = spec.params();
  std::vector<std::vector<double>> w(ps.size()), grad(ps.size());
  for (std::size_t p = 0; p < ps.size(); ++p) {
    for (std::size_t i = 0; i < ps[p].numel(); ++i) w[p].push_back(float(ps[p].init(std::int64_t(i))));
    grad[p].assign(w[p].size(), 0.0);
  }
  toy::reference_grads(o.model, id, w, toy::make_batch(o.model.vocab, 0, o.world * o.micro_batches * o.rows), grad);
  return grad;
}

double rel_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    d += std::pow(double(got[i]) - want[i], 2);
    n += want[i] * want[i];
  }
  return std::sqrt(d) / std::sqrt(n);
}

template <class Policies>
void gradient_and_moments_match_reference() {
  toy::train_options o = toy::base_options(3);  // 3 ranks: uneven shards; biases replicated
  o.micro_batches = 2;
  const auto want = reference_first_grads(o);
  run_ranks(o.world, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    const auto global = toy::make_batch(o.model.vocab, 0, o.world * o.micro_batches * o.rows);
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      feat::run_micro_batch(eng, o.model, id, toy::slice(global, (mb * o.world + comm.rank()) * o.rows, o.rows));
      if (mb == 0)
        CHECK(kind_of([&] { (void)eng.gather_optimizer_state(id.W[0], state_field::m); }) == error_kind::usage);
    }
    for (param_id p = 0; p < eng.spec().params().size(); ++p) {
      if (!eng.spec().param(p).trainable) {
        CHECK(message_of([&] { (void)eng.gather_grad(p); }).find("frozen") != std::string::npos);
        continue;
      }
      INFO("parameter " << eng.spec().param(p).name);
      CHECK(rel_diff(eng.gather_grad(p), want[p]) < 1e-5);
    }
    eng.step();
    CHECK(kind_of([&] { (void)eng.gather_grad(id.E); }) == error_kind::usage);  // after the step: gone
    // AdamW's first step: m = (1 - beta1) g, v = (1 - beta2) g^2 (no clipping here)
    for (param_id p : {id.E, id.W[1], id.b[1]}) {
      INFO("parameter " << eng.spec().param(p).name);
      std::vector<double> m1, v1;
      for (double g : want[p]) {
        m1.push_back((1 - double(0.9f)) * g);
        v1.push_back((1 - double(0.999f)) * g * g);
      }
      CHECK(rel_diff(eng.gather_optimizer_state(p, state_field::m), m1) < 1e-5);
      CHECK(rel_diff(eng.gather_optimizer_state(p, state_field::v), v1) < 1e-5);
      const auto master = eng.gather_optimizer_state(p, state_field::master);
      CHECK(master == eng.gather_param(p));  // f32 working parameters: the same values
    }
  });
}

}  // namespace

TEST_CASE("state access: the full gradient before the step and the moments after it equal float64") {
  gradient_and_moments_match_reference<default_policies>();
  gradient_and_moments_match_reference<host_offload>();
}

template <class Policies>
void write_then_train() {
  // Rank 1 writes new values into W0 (sharded) and b0 (replicated) and new moments into W2;
  // training then continues from them exactly as the reference does from the same state.
  feat::plan pl;
  pl.base = toy::base_options(3);
  pl.base.steps = 2;
  const auto spec_for_sizes = [&] {
    toy::ids id;
    return toy::make_spec(pl.base.model, id);
  }();
  const std::size_t nW = spec_for_sizes.param(spec_for_sizes.param_by_name("W0")).numel();
  const std::size_t nb = spec_for_sizes.param(spec_for_sizes.param_by_name("b0")).numel();
  std::vector<float> W(nW), b(nb), m(nW, 0.01f), v(nW, 0.002f);
  for (std::size_t i = 0; i < nW; ++i) W[i] = 0.05f * float(int(i % 7) - 3);
  for (std::size_t i = 0; i < nb; ++i) b[i] = -0.02f * float(i);
  std::mutex mu;
  std::vector<std::vector<float>> got;
  run_ranks(3, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, toy::make_spec(pl.base.model, id), pl.base.engine);
    const bool writer = comm.rank() == 1;
    eng.write_param(id.W[0], writer ? std::span<const float>(W) : std::span<const float>{}, 1);
    eng.write_param(id.b[0], writer ? std::span<const float>(b) : std::span<const float>{}, 1);
    eng.write_optimizer_state(id.W[2], state_field::m, writer ? std::span<const float>(m) : std::span<const float>{},
                              1);
    eng.write_optimizer_state(id.W[2], state_field::v, writer ? std::span<const float>(v) : std::span<const float>{},
                              1);
    CHECK(eng.gather_param(id.W[0]) == W);
    CHECK(eng.gather_optimizer_state(id.W[0], state_field::master) == W);
    CHECK(eng.gather_param(id.b[0]) == b);
    CHECK(eng.gather_optimizer_state(id.W[2], state_field::v) == v);
    const int per_step = pl.base.world * pl.base.rows;
    for (int step = 0; step < pl.base.steps; ++step) {
      const auto global = toy::make_batch(pl.base.model.vocab, std::uint64_t(step), per_step);
      feat::run_micro_batch(eng, pl.base.model, id, toy::slice(global, comm.rank() * pl.base.rows, pl.base.rows));
      eng.step();
    }
    std::vector<std::vector<float>> params;
    for (param_id p = 0; p < eng.spec().params().size(); ++p) params.push_back(eng.gather_param(p));
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      got = params;
    }
  });
  // the reference starts from the written state (its own copy, not the engine's)
  toy::ids id;
  const auto spec = toy::make_spec(pl.base.model, id);
  feat::reference_model r = feat::reference_init(pl, spec);
  r.master[id.W[0]].assign(W.begin(), W.end());
  r.master[id.b[0]].assign(b.begin(), b.end());
  r.m[id.W[2]].assign(m.begin(), m.end());
  r.v[id.W[2]].assign(v.begin(), v.end());
  const auto want = feat::train_reference(pl, r);
  for (std::size_t p = 0; p < want.params.size(); ++p) {
    INFO("parameter " << spec.param(param_id(p)).name);
    std::vector<double> w(want.params[p].begin(), want.params[p].end());
    CHECK(rel_diff(got[p], w) < 1e-5);
  }
}

TEST_CASE("state access: a value and moments written by one rank; training continues as float64 does") {
  write_then_train<default_policies>();
  write_then_train<host_offload>();
}

TEST_CASE("state access: bad calls fail on every rank alike, none hangs") {
  toy::on_toy_engines(2, [](auto& eng, const toy::ids& id, thread_comm& comm) {
    const std::vector<float> short_value(3, 1.0f);
    // the writer passes a wrong size: every rank learns it
    CHECK(message_of([&] { eng.write_param(id.W[0], short_value, 0); }).find("wrong size") != std::string::npos);
    CHECK(message_of([&] { eng.write_param(id.W[0], {}, 5); }).find("not in a world of 2") != std::string::npos);
    // ranks naming different writers
    CHECK(message_of([&] { eng.write_param(id.W[0], {}, comm.rank()); }).find("different arguments") !=
          std::string::npos);
    CHECK(message_of([&] { (void)eng.gather_optimizer_state(id.s[0], state_field::m); }).find("is frozen") !=
          std::string::npos);  // frozen since registration
    CHECK(kind_of([&] { eng.write_optimizer_state(id.W[0], state_field::master, {}, 0); }) == error_kind::usage);
    CHECK(kind_of([&] { (void)eng.gather_grad(id.W[0]); }) == error_kind::usage);  // no backward yet
    {
      auto g = eng.forward(id.embed);
      CHECK(message_of([&] { eng.write_param(id.E, {}, 0); }).find("during a step") != std::string::npos);
    }
    eng.begin_backward();
    { auto g = eng.backward(id.embed); }
    eng.end_backward();
    eng.step();
    // the engine is still usable after all of that
    CHECK(eng.gather_param(id.E).size() == eng.spec().param(id.E).numel());
  });
}

// Issue 25 point 10: moments that would turn the parameter into NaN at the next step (a negative
// or non-finite v, a non-finite m) are refused on every rank before anything changes.
TEST_CASE("write_optimizer_state refuses a negative or non-finite v and a non-finite m, on every rank") {
  toy::on_toy_engines(2, [](auto& eng, const toy::ids& id, thread_comm& comm) {
    const std::size_t n = eng.spec().param(id.W[0]).numel();
    const bool writer = comm.rank() == 1;
    auto write = [&](state_field f, const std::vector<float>& x) {
      eng.write_optimizer_state(id.W[0], f, writer ? std::span<const float>(x) : std::span<const float>{}, 1);
    };
    std::vector<float> good(n, 0.01f);
    good[3] = -0.0f;  // a zero of either sign is a valid second moment
    good[4] = 0.0f;
    write(state_field::v, good);
    std::vector<float> m(n, -0.02f);  // a first moment may be negative
    write(state_field::m, m);
    struct bad_case {
      state_field f;
      float x;
      const char* text;
    };
    const bad_case cases[] = {
        {state_field::v, -1e-3f,
         "a v for 'W0' whose element #5 is -0.001: a second moment must be finite and not negative"},
        {state_field::v, NAN, "a v for 'W0' whose element #5 is nan: a second moment must be finite and not negative"},
        {state_field::v, INFINITY,
         "a v for 'W0' whose element #5 is inf: a second moment must be finite and not negative"},
        {state_field::m, NAN, "an m for 'W0' whose element #5 is nan: a first moment must be finite"},
        {state_field::m, -INFINITY, "an m for 'W0' whose element #5 is -inf: a first moment must be finite"},
    };
    for (const auto& c : cases) {
      std::vector<float> x = c.f == state_field::v ? good : m;
      x[5] = c.x;
      x[7] = c.x;  // the first bad element is named
      const std::string msg = message_of([&] { write(c.f, x); });
      INFO(msg);
      CHECK(msg.find("write_optimizer_state(): rank 1 (the writer) passed ") != std::string::npos);
      CHECK(msg.find(c.text) != std::string::npos);
      CHECK(kind_of([&] { write(c.f, x); }) == error_kind::usage);
    }
    // nothing changed, and the engine goes on
    const auto v = eng.gather_optimizer_state(id.W[0], state_field::v);
    CHECK(std::equal(v.begin(), v.end(), good.begin(), [](float a, float b) {
      return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
    }));
    CHECK(eng.gather_optimizer_state(id.W[0], state_field::m) == m);
  });
}

namespace {
// Issue 25 point 8: element ranges near SIZE_MAX wrapped in the checks (offset + n <= shard_numel)
// and reached the heap. Every range is checked without wrapping, by the engine and by each
// Offloader's own state access behind it.
template <class Policies>
void shard_ranges_never_wrap() {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, toy::make_spec({}, id), toy::base_options(2).engine);
    auto& off = const_cast<typename decltype(eng)::offloader_type&>(eng.offloader());
    constexpr std::size_t max = SIZE_MAX;
    for (param_id p : {id.W[0], id.b[0]}) {  // sharded, replicated
      const std::size_t n = eng.layout(p).shard_numel;
      REQUIRE(n >= 2);
      std::vector<float> buf(n, 1.0f);
      struct range {
        std::size_t offset, count;
        bool ok;
      };
      const range ranges[] = {{max, 4, false}, {max - 1, 4, false}, {max - 3, 4, false}, {max, 1, false},
                              {max, 0, false}, {1, max, false},     {0, max, false},     {max, max, false},
                              {n, 1, false},   {n + 1, 0, false},   {n - 1, 2, false},   {0, n + 1, false},
                              {n, 0, true},    {0, n, true},        {n - 1, 1, true},    {0, 0, true}};
      for (state_field f : {state_field::working, state_field::master, state_field::m, state_field::v}) {
        for (const range& r : ranges) {
          INFO(eng.spec().param(p).name << " " << to_string(f) << " offset " << r.offset << " count " << r.count);
          if (r.ok) {
            CHECK_NOTHROW(eng.read_shard(p, f, r.offset, buf.data(), r.count));
            CHECK_NOTHROW(eng.write_shard(p, f, r.offset, buf.data(), r.count));
            if (f != state_field::working) {
              CHECK_NOTHROW(off.read_state(p, f, r.offset, buf.data(), r.count));
              CHECK_NOTHROW(off.write_state(p, f, r.offset, buf.data(), r.count));
            }
            continue;
          }
          const std::string msg = message_of([&] { eng.read_shard(p, f, r.offset, buf.data(), r.count); });
          CHECK(msg.find("whose shard has " + std::to_string(n)) != std::string::npos);
          CHECK(kind_of([&] { eng.write_shard(p, f, r.offset, buf.data(), r.count); }) == error_kind::usage);
          if (f != state_field::working) {
            CHECK(kind_of([&] { off.read_state(p, f, r.offset, buf.data(), r.count); }) == error_kind::usage);
            CHECK(kind_of([&] { off.write_state(p, f, r.offset, buf.data(), r.count); }) == error_kind::usage);
          }
        }
      }
    }
  });
}
}  // namespace

TEST_CASE("state access: element ranges near SIZE_MAX are refused, never wrapped (read_shard, write_shard)") {
  shard_ranges_never_wrap<default_policies>();
  shard_ranges_never_wrap<host_offload>();
}

TEST_CASE("state access under hybrid sharding: a rank of any shard group writes, every group takes the value") {
  toy::ids id;
  const auto spec = toy::make_spec({}, id);
  const std::size_t n = spec.param(id.W[0]).numel();
  std::vector<float> W(n);
  for (std::size_t i = 0; i < n; ++i) W[i] = 0.01f * float(int(i % 11) - 5);
  run_ranks(4, [&](thread_comm& comm) {
    host_backend backend;
    engine_config cfg;
    cfg.hybrid.shard_group_size = 2;  // two shard groups of two ranks, replicated across them
    engine<host_backend, thread_comm> eng(backend, comm, spec, cfg);
    const bool writer = comm.rank() == 3;  // a world rank in the second group
    eng.write_param(id.W[0], writer ? std::span<const float>(W) : std::span<const float>{}, 3);
    CHECK(eng.gather_param(id.W[0]) == W);
    CHECK(eng.gather_optimizer_state(id.W[0], state_field::master) == W);
    CHECK(message_of([&] { eng.write_param(id.W[0], {}, 4); }).find("not in a world of 4") != std::string::npos);
  });
}
