// What a training stack changes between steps (issue 19, points 3, 5 and 6): learning rate and
// weight decay per parameter group with a per-group schedule, clipping by norm type 2, 1 and
// inf, freezing and unfreezing, and no-sync gradient accumulation. Each trained on thread ranks
// with both Offloaders and compared with feature_training.hpp's float64 reference.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>

#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "feature_training.hpp"
#include "zshard/testing/invariants.hpp"

using namespace zshard;
using test_support::kind_of;
using test_support::message_of;

namespace {

using host_offload = test_support::host_offload_policies;

// Trains `pl` with the on-device and the host Offloader, on 1 and 3 ranks, against the reference.
void check_both_offloaders(feat::plan pl, const std::string& what) {
  for (int world : {1, 3}) {
    pl.base.world = world;
    const auto want = feat::train_reference(pl);
    toy::check_equal(feat::train_sharded(pl), want, dtype::f32, what + ", on_device, world " + std::to_string(world));
    pl.base.engine.offload.host_threads = 2;
    toy::check_equal(feat::train_sharded<host_offload>(pl), want, dtype::f32,
                     what + ", host_adam, world " + std::to_string(world));
  }
}

feat::plan grouped_plan() {
  feat::plan pl;
  pl.base.steps = 5;
  pl.base.engine.adamw.lr = 1e-2f;
  pl.base.engine.adamw.weight_decay = 0.1f;
  pl.base.engine.param_groups = {
      {.name = "embeddings", .params = {"E"}, .lr = 3e-2f, .weight_decay = 0.0f},
      {.name = "late_layers",
       .match = [](const param_spec& p) { return p.name == "W2" || p.name == "b2"; },
       .lr = 5e-3f,
       .weight_decay = 0.3f},
  };
  return pl;
}

}  // namespace

TEST_CASE("parameter groups: learning rate and weight decay per group, set_lr per group") {
  feat::plan pl = grouped_plan();
  pl.lr_at.insert({2, {"embeddings", 1e-2f}});  // a per-group schedule
  pl.lr_at.insert({3, {"default", 2e-2f}});
  pl.lr_at.insert({4, {"late_layers", 1e-3f}});
  check_both_offloaders(pl, "groups");
  // the groups matter: the same run without them ends elsewhere
  feat::plan plain = pl;
  plain.base.engine.param_groups.clear();
  plain.lr_at.clear();
  const auto a = feat::train_reference(pl), b = feat::train_reference(plain);
  CHECK(a.params[0] != b.params[0]);
}

TEST_CASE("parameter groups: lr() and set_lr() name groups; bad groups are configuration errors") {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine_config cfg = grouped_plan().base.engine;
    engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
    CHECK(eng.lr("embeddings") == 3e-2f);
    CHECK(eng.lr() == 1e-2f);  // the default group
    eng.set_lr("late_layers", 4e-3f);
    CHECK(eng.lr("late_layers") == 4e-3f);
    eng.set_lr(1e-3f);  // every group
    CHECK(eng.lr("embeddings") == 1e-3f);
    CHECK(message_of([&] { eng.set_lr("nope", 1e-3f); }).find("no parameter group named 'nope'") != std::string::npos);
    CHECK(kind_of([&] { eng.set_lr("default", -1.0f); }) == error_kind::config);
    CHECK(eng.param_groups().name(eng.param_groups().group_of(id.E)) == "embeddings");
  });
  toy::ids id;
  const auto spec = toy::make_spec({}, id);
  const optim::adamw_config base;
  using G = std::vector<optim::param_group>;
  CHECK(message_of([&] {
          optim::param_groups(spec, G{{.name = "a", .params = {"E"}}, {.name = "b", .params = {"E"}}}, base);
        }).find("'E' is in parameter groups 'a' and 'b'") != std::string::npos);
  CHECK(message_of([&] {
          optim::param_groups(spec, G{{.name = "a", .params = {"nope"}}}, base);
        }).find("no parameter named 'nope'") != std::string::npos);
  CHECK(message_of([&] { optim::param_groups(spec, G{{.name = "a"}}, base); }).find("has no parameters") !=
        std::string::npos);
  CHECK(kind_of([&] { optim::param_groups(spec, G{{.name = "a", .params = {"E"}, .lr = 0.0f}}, base); }) ==
        error_kind::config);
  CHECK(kind_of([&] { optim::param_groups(spec, G{{.name = "default", .params = {"E"}}}, base); }) ==
        error_kind::config);
}

TEST_CASE("ranks with different parameter groups or norm types are refused at construction, naming what differs") {
  auto refused = [](auto configure) {
    return message_of([&] {
      run_ranks(2, [&](thread_comm& comm) {
        toy::ids id;
        host_backend backend;
        engine_config cfg;
        configure(cfg, comm.rank());
        engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
      });
    });
  };
  CHECK(refused([](engine_config& c, int r) {
          c.param_groups = {{.name = "e", .params = {"E"}, .lr = r == 0 ? 1e-2f : 2e-2f}};
        }).find("ranks disagree on param_groups (learning rates)") != std::string::npos);
  CHECK(refused([](engine_config& c, int r) {
          c.param_groups = {{.name = "e", .params = {r == 0 ? "E" : "c"}}};
        }).find("ranks disagree on param_groups (names and members)") != std::string::npos);
  CHECK(refused([](engine_config& c, int r) {
          c.param_groups = {{.name = "e", .params = {"E"}, .weight_decay = r == 0 ? 0.0f : 0.5f}};
        }).find("ranks disagree on param_groups (weight decays)") != std::string::npos);
  CHECK(refused([](engine_config& c, int r) { c.clip_norm_type = r == 0 ? 2.0 : 1.0; })
            .find("ranks disagree on clip_norm_type") != std::string::npos);
}

namespace {
// Counts every collective by its use (collective_tag::use), forwarding to thread_comm.
struct use_counting_comm {
  using zshard_tag = communicator_tag;
  thread_comm& inner;
  std::map<collective_use, int> calls{};
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  void all_gather(const void* s, void* d, std::size_t n, dtype t, comm_stream cs, const collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.all_gather(s, d, n, t, cs, tag);
  }
  void reduce_scatter(const void* s, void* d, std::size_t n, dtype t, reduce_op op, comm_stream cs,
                      const collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.reduce_scatter(s, d, n, t, op, cs, tag);
  }
  void all_reduce(const void* s, void* d, std::size_t n, dtype t, reduce_op op, comm_stream cs,
                  const collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.all_reduce(s, d, n, t, op, cs, tag);
  }
  void broadcast(void* d, std::size_t n, dtype t, int root, comm_stream cs, const collective_tag& tag = {}) {
    ++calls[tag.use];
    inner.broadcast(d, n, t, root, cs, tag);
  }
  void barrier(comm_stream cs) { inner.barrier(cs); }
};
}  // namespace

TEST_CASE("step() is one exchange whatever the norm type: the norm's parts ride with the fingerprint") {
  for (double type : {2.0, 1.0, double(INFINITY)}) {
    run_ranks(3, [&](thread_comm& tc) {
      use_counting_comm comm{tc};
      toy::ids id;
      host_backend backend;
      engine_config cfg;
      cfg.clip_norm = 0.1;
      cfg.clip_norm_type = type;
      engine<host_backend, use_counting_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
      { auto g = eng.forward(id.embed); }
      eng.begin_backward();
      {
        auto g = eng.backward(id.embed);
        g.grad_data(0)[comm.rank()] += 1.0f + float(comm.rank());  // one element per rank: 1, 2, 3
      }
      eng.end_backward();
      comm.calls.clear();
      const auto r = eng.step();
      CHECK(comm.calls.size() == 1);
      CHECK(comm.calls[collective_use::step_check] == 1);
      // the reduced gradient averages over 3 ranks: elements 1/3, 2/3, 3/3
      const double want = type == 2.0 ? std::sqrt(1.0 + 4.0 + 9.0) / 3 : type == 1.0 ? 6.0 / 3 : 3.0 / 3;
      CHECK(r.grad_norm == doctest::Approx(want).epsilon(1e-6));
    });
  }
}

TEST_CASE("gradient clipping by norm type 2, 1 and inf equals clip_grad_norm_ in float64") {
  for (double type : {2.0, 1.0, double(INFINITY)}) {
    feat::plan pl = grouped_plan();
    pl.base.engine.clip_norm_type = type;
    pl.base.engine.partition.persistence_threshold_numel = 8;  // replicated parameters count once
    const auto want = feat::train_reference(pl);
    // the clip binds: max_norm well under the norm of every step
    double smallest = INFINITY;
    for (const auto& r : want.reports) smallest = std::min(smallest, r.grad_norm);
    pl.base.engine.clip_norm = smallest / 3;
    check_both_offloaders(pl, "clip norm type " + std::to_string(type));
    for (const auto& r : feat::train_reference(pl).reports) CHECK(r.clip_coefficient < 0.5);
  }
  engine_config cfg;
  cfg.clip_norm_type = 3.0;
  CHECK(message_of([&] { cfg.validate(); }).find("clip_norm_type") != std::string::npos);
}

TEST_CASE("freezing and unfreezing between steps: state kept when frozen, created when first unfrozen") {
  feat::plan pl = grouped_plan();
  pl.base.steps = 6;
  pl.frozen_at_start = {"W2"};                 // never trained until step 3: its state is created then
  pl.trainable_at.insert({1, {"W1", false}});  // trained, frozen for two steps (its m, v kept), then back
  pl.trainable_at.insert({1, {"E", false}});   // tied embedding: frozen for both of its uses
  pl.trainable_at.insert({3, {"W1", true}});
  pl.trainable_at.insert({3, {"W2", true}});
  pl.trainable_at.insert({4, {"E", true}});
  pl.trainable_at.insert({5, {"b0", false}});  // replicated (persistence threshold)
  check_both_offloaders(pl, "freeze/unfreeze");
}

TEST_CASE("set_trainable: between steps only, on every rank alike, and the gradient goes away") {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), {});
    { auto g = eng.forward(id.embed); }
    CHECK(message_of([&] { eng.set_trainable(id.E, false); }).find("during a step") != std::string::npos);
    eng.begin_backward();
    { auto g = eng.backward(id.embed); }
    eng.end_backward();
    CHECK(kind_of([&] { eng.set_trainable(id.E, false); }) == error_kind::usage);  // a micro-batch awaits step()
    eng.step();
    const std::size_t state_before = eng.ledger().current(mem_category::optimizer_state);
    eng.set_trainable(id.W[1], false);
    CHECK(eng.ledger().current(mem_category::optimizer_state) == state_before);  // kept
    {
      auto g = eng.forward(id.layer[1]);
      g.close();
    }
    eng.begin_backward();
    {
      auto g = eng.backward(id.layer[1]);
      CHECK(message_of([&] { (void)g.grad(0); }).find("frozen") != std::string::npos);
    }
    eng.end_backward();
    eng.step();
    eng.set_trainable(id.s[0], true);  // frozen at registration: state created now
    CHECK(eng.ledger().current(mem_category::optimizer_state) > state_before);
  });
  CHECK(message_of([] {
          run_ranks(2, [](thread_comm& comm) {
            toy::ids id;
            host_backend backend;
            engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), {});
            eng.set_trainable(comm.rank() == 0 ? id.W[0] : id.W[1], false);
          });
        }).find("different arguments") != std::string::npos);
}

TEST_CASE("no-sync accumulation: one reduction per step, same training, full gradients held in between") {
  feat::plan pl = grouped_plan();
  pl.base.micro_batches = 3;
  pl.no_sync = true;
  pl.base.engine.clip_norm = 0.5;
  check_both_offloaders(pl, "no-sync");
  // memory: with sync off the full gradients of every trainable parameter stay between micro-batches
  pl.base.world = 2;
  feat::plan synced = pl;
  synced.no_sync = false;
  const auto held = feat::train_sharded(pl), each = feat::train_sharded(synced);
  std::size_t full_grads = 0;
  toy::ids id;
  const auto spec = toy::make_spec(pl.base.model, id);
  for (const auto& p : spec.params())
    if (p.trainable) full_grads += padded_count(p.numel(), 2) * sizeof(float);
  CHECK(held.peak_grad_bucket_bytes >= full_grads);
  CHECK(each.peak_grad_bucket_bytes < full_grads);
}

TEST_CASE("no-sync: step() with gradients held is refused; a module the last micro-batch skips is still reduced") {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine_config cfg;
    cfg.adamw.weight_decay = 0.0f;
    engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
    auto micro_batch = [&](module_id m, float g0) {
      { auto g = eng.forward(m); }
      eng.begin_backward();
      {
        auto g = eng.backward(m);
        g.grad_data(0)[0] += g0;
      }
      eng.end_backward();
    };
    eng.set_gradient_sync(false);
    micro_batch(id.layer[2], 1.0f);  // only this micro-batch touches layer 2
    CHECK(message_of([&] { eng.step(); }).find("held unreduced") != std::string::npos);
    { auto g = eng.forward(id.embed); }
    CHECK(message_of([&] { eng.set_gradient_sync(true); }).find("inside a micro-batch") != std::string::npos);
    eng.begin_backward();
    { auto g = eng.backward(id.embed); }
    eng.end_backward();
    eng.set_gradient_sync(true);
    micro_batch(id.layer[0], 1.0f);  // the synced micro-batch skips layer 2
    std::vector<float> w_before = eng.gather_param(id.W[2]);
    const auto r = eng.step();
    // layer 2's gradient (1 at element 0 on each rank, averaged over ranks, over 3 micro-batches)
    // was reduced at the end of the synced micro-batch: AdamW's first step moves W2[0] by lr
    CHECK(eng.gather_param(id.W[2])[0] == doctest::Approx(w_before[0] - cfg.adamw.lr).epsilon(1e-4));
    CHECK(r.micro_batches == 3);
    CHECK(eng.ledger().current(mem_category::grad_buckets) == 0);
    CHECK(testing::step_boundary_violations(eng).empty());
    CHECK(testing::memory_bound_violations(eng).empty());  // the bound knows no-sync holds full gradients
  });
}

namespace {
// An Offloader that does not say it applies parameter groups (as a user's own might not).
template <class Backend, class Comm>
struct no_groups_impl : offload::on_device_impl<Backend, Comm> {
  using offload::on_device_impl<Backend, Comm>::on_device_impl;
  static constexpr bool applies_param_groups = false;
};
struct no_groups {
  using zshard_tag = offloader_tag;
  template <class Backend, class Comm>
  using impl = no_groups_impl<Backend, Comm>;
};
using no_groups_policies = test_support::with_offloader<no_groups>;
}  // namespace

TEST_CASE("parameter groups with an Offloader that does not apply them are refused, not ignored") {
  toy::ids id;
  const auto spec = toy::make_spec({}, id);
  run_ranks(1, [&](thread_comm& comm) {
    host_backend backend;
    engine_config cfg;
    engine<host_backend, thread_comm, no_groups_policies> plain(backend, comm, spec, cfg);  // no groups: fine
    cfg.param_groups = {{.name = "e", .params = {"E"}, .lr = 1e-3f}};
    CHECK(message_of([&] { engine<host_backend, thread_comm, no_groups_policies> eng(backend, comm, spec, cfg); })
              .find("does not apply parameter groups") != std::string::npos);
  });
}
