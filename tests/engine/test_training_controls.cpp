// What a training stack changes between steps (issue 19, points 3, 5 and 6): learning rate and
// weight decay per parameter group with a per-group schedule, clipping by norm type 2, 1 and
// inf, freezing and unfreezing, and no-sync gradient accumulation. Each trained on thread ranks
// with both Offloaders and compared with feature_training.hpp's float64 reference.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include "../checkpoint/test_dir.hpp"
#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "../support/use_counting_comm.hpp"
#include "feature_training.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
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

// Issue 25 point 10: a learning rate set on some ranks only would train one parameter's shards at
// two rates. The step's one exchange carries the rates' hash: every rank fails, naming the group
// and each rank's rate, before anything is applied.
TEST_CASE("set_lr on one rank only fails the next step on every rank, naming the group and the rates") {
  std::vector<std::string> messages(3);
  std::vector<error_kind> kinds(3, error_kind::invariant);
  const feat::plan pl = grouped_plan();
  run_ranks(3, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec(pl.base.model, id), pl.base.engine);
    const auto global = toy::make_batch(pl.base.model.vocab, 0, 3 * pl.base.rows);
    auto micro_batch = [&] {
      feat::run_micro_batch(eng, pl.base.model, id, toy::slice(global, comm.rank() * pl.base.rows, pl.base.rows));
    };
    eng.set_lr("embeddings", 2e-2f);  // on every rank: fine
    micro_batch();
    eng.step();
    if (comm.rank() == 1) eng.set_lr("late_layers", 4e-3f);
    if (comm.rank() == 2) eng.set_lr(2.5e-3f);  // every group
    micro_batch();
    const std::size_t r = std::size_t(comm.rank());
    messages[r] = message_of([&] { eng.step(); });
    kinds[r] = kind_of([&] { eng.step(); });  // the engine stays failed
  });
  for (int r = 0; r < 3; ++r) {
    const std::string& m = messages[std::size_t(r)];
    INFO("rank " << r << ": " << m);
    CHECK(kinds[std::size_t(r)] == error_kind::usage);
    CHECK(m.find("ranks disagree on the learning rates at step 2") != std::string::npos);
    CHECK(m.find("group 'default': rank 0 has 0.01, rank 1 has 0.01, rank 2 has 0.0025") != std::string::npos);
    CHECK(m.find("group 'embeddings': rank 0 has 0.02, rank 1 has 0.02, rank 2 has 0.0025") != std::string::npos);
    CHECK(m.find("group 'late_layers': rank 0 has 0.005, rank 1 has 0.004, rank 2 has 0.0025") != std::string::npos);
    CHECK(m.find("set_lr") != std::string::npos);  // the hint names the call
  }
}

using test_support::use_counting_comm;

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

namespace {
// A full value for parameter `name` of the toy model, away from its initial value.
std::vector<float> new_value(const std::string& name, float scale) {
  toy::ids id;
  const auto spec = toy::make_spec({}, id);
  std::vector<float> v(spec.param(spec.param_by_name(name)).numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * float(int(i % 5) - 2);
  return v;
}
}  // namespace

// Issue 25 point 7: a value written while a parameter is frozen is where it trains from once
// unfrozen (its master follows the working value; m, v and the update count are kept).
TEST_CASE("unfreezing after write_param trains from the written value, not a stale master") {
  feat::plan pl = grouped_plan();
  pl.base.steps = 5;
  pl.trainable_at.insert({1, {"W1", false}});  // trained once: its state exists and is kept while frozen
  pl.value_at.insert({2, {"W1", new_value("W1", 0.3f)}});
  pl.trainable_at.insert({2, {"W1", true}});   // written, then unfrozen before the same step
  pl.trainable_at.insert({1, {"b0", false}});  // replicated; written while frozen, frozen for one more step
  pl.value_at.insert({2, {"b0", new_value("b0", 0.05f)}});
  pl.trainable_at.insert({3, {"b0", true}});
  pl.frozen_at_start = {"W2"};  // frozen since registration (no state yet), written, then unfrozen
  pl.value_at.insert({1, {"W2", new_value("W2", -0.2f)}});
  pl.trainable_at.insert({3, {"W2", true}});
  pl.value_at.insert({3, {"W0", new_value("W0", 0.1f)}});  // trainable: master and working written together
  check_both_offloaders(pl, "write while frozen, then unfreeze");
}

// The master follows the working value only where that was written: with bf16 working values a
// freeze and unfreeze without a write keeps the f32 master bit for bit (not its bf16 rounding).
TEST_CASE("unfreezing keeps an f32 master where the working value was not written (bf16 working values)") {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine_config cfg = toy::base_options(2).engine;
    cfg.param_dtype = dtype::bf16;
    engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
    const auto global = toy::make_batch(13, 0, 2 * 3);
    feat::run_micro_batch(eng, toy::config{}, id, toy::slice(global, comm.rank() * 3, 3));
    eng.step();
    const auto master = eng.gather_optimizer_state(id.W[1], state_field::master);
    const auto working = eng.gather_param(id.W[1]);
    CHECK(master != working);  // the master has bits the bf16 working value lacks
    eng.set_trainable(id.W[1], false);
    eng.set_trainable(id.W[1], true);
    CHECK(eng.gather_optimizer_state(id.W[1], state_field::master) == master);
    // written while frozen: there, and only there, the master takes the written (bf16) value
    eng.set_trainable(id.W[1], false);
    std::vector<float> w = working;
    w[0] = 0.25f;
    w[9] = -1.5f;
    eng.write_param(id.W[1], comm.rank() == 0 ? std::span<const float>(w) : std::span<const float>{}, 0);
    eng.set_trainable(id.W[1], true);
    std::vector<float> want = master;
    want[0] = 0.25f;
    want[9] = -1.5f;
    CHECK(eng.gather_optimizer_state(id.W[1], state_field::master) == want);
  });
}

namespace {
// A saves a checkpoint where W1 (frozen since registration in A) holds a written value; B, whose
// W1 was trainable at construction (state from the initial value), freezes it to load (the
// checkpoint says frozen), unfreezes it and trains: from the loaded value, as the float64
// reference does from A's state.
template <class Policies>
void unfreeze_after_load() {
  feat::plan pl = grouped_plan();
  pl.base.world = 3;
  pl.base.steps = 2;
  pl.base.engine.offload.host_threads = 2;
  const auto& o = pl.base;
  const std::vector<float> W1 = new_value("W1", 0.3f);
  ckpt_test::temp_dir dir;
  std::string saved;
  std::vector<std::vector<float>> a_value, a_m, a_v;
  std::vector<std::int64_t> a_counts;
  std::mutex mu;
  run_ranks(2, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    auto spec = toy::make_spec(o.model, id);
    spec.set_trainable(id.W[1], false);
    engine<host_backend, thread_comm, Policies> eng(backend, comm, std::move(spec), o.engine);
    eng.write_param(id.W[1], comm.rank() == 0 ? std::span<const float>(W1) : std::span<const float>{}, 0);
    const auto global = toy::make_batch(o.model.vocab, 7, 2 * o.rows);
    feat::run_micro_batch(eng, o.model, id, toy::slice(global, comm.rank() * o.rows, o.rows));
    eng.step();
    const auto s = checkpoint::save(eng, dir.path());
    std::vector<std::vector<float>> value, m, v;
    for (param_id p = 0; p < eng.spec().params().size(); ++p) {
      value.push_back(eng.gather_param(p));
      const bool t = eng.spec().param(p).trainable;
      m.push_back(t ? eng.gather_optimizer_state(p, state_field::m) : std::vector<float>{});
      v.push_back(t ? eng.gather_optimizer_state(p, state_field::v) : std::vector<float>{});
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      saved = s.path;
      a_value = value;
      a_m = m;
      a_v = v;
      a_counts = eng.update_counts();
    }
  });
  toy::train_result got;
  run_ranks(o.world, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    eng.set_trainable(id.W[1], false);
    checkpoint::load(eng, saved);
    eng.set_trainable(id.W[1], true);
    std::vector<step_report> reports;
    for (int step = 0; step < o.steps; ++step) {
      const auto global = toy::make_batch(o.model.vocab, std::uint64_t(step), o.world * o.rows);
      feat::run_micro_batch(eng, o.model, id, toy::slice(global, comm.rank() * o.rows, o.rows));
      reports.push_back(eng.step());
    }
    std::vector<std::vector<float>> params;
    for (param_id p = 0; p < eng.spec().params().size(); ++p) params.push_back(eng.gather_param(p));
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      got.params = params;
      got.reports = reports;
    }
  });
  // the reference continues from A's state: W1's loaded value with zero moments and no update yet
  toy::ids id;
  const auto spec = feat::make_spec(pl, id);
  feat::reference_model r = feat::reference_init(pl, spec);
  for (std::size_t p = 0; p < r.master.size(); ++p) {
    r.master[p].assign(a_value[p].begin(), a_value[p].end());
    if (!a_m[p].empty()) r.m[p].assign(a_m[p].begin(), a_m[p].end());
    if (!a_v[p].empty()) r.v[p].assign(a_v[p].begin(), a_v[p].end());
    r.updates[p] = a_counts[p];
  }
  REQUIRE(a_counts[id.W[1]] == 0);
  auto want = feat::train_reference(pl, r);
  for (std::size_t s = 0; s < want.reports.size(); ++s) want.reports[s].step += 1;  // B resumed at step 1
  toy::check_equal(got, want, dtype::f32, "unfreeze after a load");
}
}  // namespace

TEST_CASE("unfreezing after a checkpoint load trains from the loaded value, not a stale master") {
  unfreeze_after_load<default_policies>();
  unfreeze_after_load<host_offload>();
}

TEST_CASE("set_trainable: between steps only, on every rank alike, and the gradient goes away") {
  toy::on_toy_engines(2, [](auto& eng, const toy::ids& id, thread_comm&) {
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
          toy::on_toy_engines(2, [](auto& eng, const toy::ids& id, thread_comm& comm) {
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
struct no_groups : test_support::family<offloader_tag, no_groups_impl> {};
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
