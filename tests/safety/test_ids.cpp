// Issue 11, point 4: ids carry the identity of their model_spec. An id of another spec is a
// usage error at every entry point that takes one, even when its index is in range (the
// silent wrong parameter this issue exists to stop); copies of a spec share its ids; ids made
// from bare integers are range-checked; two engines of two models in one process each train
// correctly while crossing their ids fails.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../support/error_capture.hpp"
#include "stack_model.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/schedule_recorder.hpp"
#include "zshard/plan/step_schedule.hpp"

using namespace safety;
using test_support::message_of;

namespace {

// The error a foreign id must give: a usage error naming both specs (serials, and names where
// given) and the fix.
template <class F>
void check_foreign(F&& f, const model_spec& ours, const model_spec& theirs, const std::string& where) {
  std::string what;
  error_kind kind = error_kind::invariant;
  try {
    f();
    FAIL("a foreign id was accepted by " << where);
  } catch (const error& e) {
    what = e.what();
    kind = e.kind();
  }
  INFO(where << ": " << what);
  CHECK(kind == error_kind::usage);
  CHECK(contains(what, where));
  CHECK(contains(what, "belongs to " + theirs.label() + ", not to " + ours.label() + " (this one"));
  CHECK(contains(what, "use the ids returned by this engine's model_spec"));
}

// A model unlike stack_spec (other shapes and initialisers, fewer parameters), so that an
// engine of it and one of stack_spec are two different models in one process.
model_spec other_spec() {
  model_spec spec;
  const param_id e = spec.add_param("emb", {5, 11}, {.init = init::normal(0, 0.3f, 7)});
  const param_id w = spec.add_param("w", {11, 11}, {.init = init::uniform(-0.5f, 0.5f, 8)});
  const param_id g = spec.add_param("gain", {11}, {.decay = false, .init = init::constant(1.0f)});
  spec.add_module("embed", {e});
  spec.add_module("mix", {w, g});
  spec.add_module("head", {e});  // tied
  return spec;
}

model_spec named(model_spec spec, std::string name) {
  spec.set_name(std::move(name));
  return spec;
}

}  // namespace

TEST_CASE("ids a spec hands out are bound to it; a copy shares them, another spec does not") {
  const model_spec a = stack_spec(2, 1), b = stack_spec(2, 1);
  CHECK(a.serial() != b.serial());
  CHECK(a.serial() != param_id::unbound);
  CHECK(a.fingerprint() == b.fingerprint());  // the same structure: ranks' specs still agree

  for (param_id p : a.param_ids()) CHECK(p.spec_serial() == a.serial());
  for (module_id m : a.module_ids()) {
    CHECK(m.spec_serial() == a.serial());
    for (param_id p : a.module(m).params) CHECK(p.spec_serial() == a.serial());
  }
  CHECK(a.param_ids().size() == a.params().size());
  CHECK(a.module_ids().size() == a.modules().size());
  CHECK(a.param_by_name("b1.w").spec_serial() == a.serial());
  CHECK(a.module_by_name("e0").spec_serial() == a.serial());
  CHECK(a.param_by_name("b1.w") == b.param_by_name("b1.w"));  // comparisons look at the index

  // Every id of b is in range for a, and refused there.
  for (param_id p : b.param_ids()) check_foreign([&] { (void)a.param(p); }, a, b, "model_spec::param");
  for (module_id m : b.module_ids()) check_foreign([&] { (void)a.module(m); }, a, b, "model_spec::module");

  // A copy describes the same model: it takes the source's ids, and its own ids are the
  // source's.
  const model_spec copy = a;
  CHECK(copy.serial() == a.serial());
  for (param_id p : a.param_ids()) CHECK(copy.param(p).name == a.param(p).name);
  for (module_id m : copy.module_ids()) CHECK(a.module(m).name == copy.module(m).name);
  check_foreign([&] { (void)copy.param(*b.param_ids().begin()); }, copy, b, "model_spec::param");

  // A move hands the identity over; the emptied source gets a fresh one.
  model_spec source = stack_spec(1, 0);
  const std::uint32_t serial = source.serial();
  const param_id w = source.param_by_name("b0.w");
  model_spec moved = std::move(source);
  CHECK(moved.serial() == serial);
  CHECK(moved.param(w).name == "b0.w");
  CHECK(source.serial() != serial);  // NOLINT(bugprone-use-after-move): the documented state
  CHECK(source.params().empty());
  model_spec assigned;
  assigned = std::move(moved);
  CHECK(assigned.serial() == serial);
  CHECK(assigned.param(w).name == "b0.w");
}

TEST_CASE("a model_spec's name is in every message that names the spec") {
  const model_spec unnamed = stack_spec(2, 0);
  CHECK(unnamed.name().empty());
  CHECK(unnamed.label() == "model_spec #" + std::to_string(unnamed.serial()));
  const model_spec student = named(stack_spec(2, 0), "student");  // 4 parameters
  const model_spec teacher = named(other_spec(), "teacher");
  const std::string s = std::to_string(student.serial()), t = std::to_string(teacher.serial());
  CHECK(student.name() == "student");
  CHECK(student.label() == "model_spec 'student' (#" + s + ")");
  CHECK(student.fingerprint() == unnamed.fingerprint());  // a label only: ranks may name it differently
  const model_spec probe("probe");
  CHECK(probe.label() == "model_spec 'probe' (#" + std::to_string(probe.serial()) + ")");

  // Both sides of a foreign id, named; an unnamed side keeps its number alone.
  CHECK(contains(message_of([&] { (void)student.param(teacher.param_by_name("w")); }),
                 "model_spec::param: parameter id 1 belongs to model_spec 'teacher' (#" + t +
                     "), not to model_spec 'student' (#" + s + ") (this one, 4 parameters)"));
  CHECK(contains(message_of([&] { (void)student.module(unnamed.module_by_name("b1")); }),
                 "module id 1 belongs to model_spec #" + std::to_string(unnamed.serial()) +
                     ", not to model_spec 'student' (#" + s + ")"));
  CHECK(contains(message_of([&] { (void)unnamed.param(student.param_by_name("b0.w")); }),
                 "belongs to model_spec 'student' (#" + s + "), not to model_spec #"));

  // A copy is the same model and keeps the name; a move hands it over with the serial.
  model_spec copy = student;
  CHECK(copy.label() == student.label());
  const model_spec moved = std::move(copy);
  CHECK(moved.label() == student.label());
  CHECK(copy.name().empty());  // NOLINT(bugprone-use-after-move): the documented state

  // An engine's copy keeps it too: its refusals name both models.
  run_ranks(1, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, student, stack_config());
    CHECK(eng.spec().label() == student.label());
    const std::string what = message_of([&] { eng.forward(teacher.module_by_name("mix")); });
    CHECK(contains(what, "engine scope"));
    CHECK(contains(what, "belongs to model_spec 'teacher' (#" + t + "), not to model_spec 'student' (#" + s + ")"));
  });

  // Renamed, or the name taken away: messages about the model's ids follow.
  model_spec renamed = stack_spec(1, 0);
  const param_id w = renamed.param_by_name("b0.w");
  renamed.set_name("first");
  renamed.set_name("second");
  CHECK(contains(message_of([&] { (void)teacher.param(w); }), "belongs to model_spec 'second' (#"));
  renamed.set_name("");
  CHECK(contains(message_of([&] { (void)teacher.param(w); }),
                 "belongs to model_spec #" + std::to_string(renamed.serial()) + ", not to model_spec 'teacher'"));
}

TEST_CASE("ids made from bare integers are unbound: range-checked only") {
  const model_spec a = stack_spec(2, 0);
  const param_id three{3};
  CHECK_FALSE(three.bound());
  CHECK(a.param(three).name == "b1.b");
  CHECK(a.module(module_id{1}).name == "b1");
  param_id counted = 0;  // loops over indices keep working
  for (; counted < a.params().size(); ++counted) (void)a.param(counted);
  CHECK(counted.index() == 4);
  const std::string what = message_of([&] { (void)a.param(param_id{4}); });
  CHECK(contains(what, "model_spec::param: parameter id 4 does not exist: the model has 4 parameters"));
  CHECK(contains(message_of([&] { (void)a.module(module_id{2}); }), "module id 2 does not exist"));
  // A bound id out of range (of a bigger copy, say) is refused too.
  model_spec bigger = a;
  const param_id extra = bigger.add_param("extra", {3});
  CHECK(extra.spec_serial() == a.serial());
  CHECK(contains(message_of([&] { (void)a.param(extra); }), "parameter id 4 does not exist"));
}

TEST_CASE("add_module refuses another spec's parameter ids, also in range") {
  model_spec a = stack_spec(2, 0);
  const model_spec b = stack_spec(2, 0);
  const param_id theirs = b.param_by_name("b0.w");
  check_foreign([&] { a.add_module("m", {theirs}); }, a, b, "add_module('m')");
  CHECK(a.modules().size() == 2);  // nothing registered
  const module_id m = a.add_module("m", {param_id{0}, a.param_by_name("b1.b")});
  for (param_id p : a.module(m).params) CHECK(p.spec_serial() == a.serial());  // bound on the way in
  check_foreign([&] { (void)param_identity::of(a, theirs, dtype::f32); }, a, b, "model_spec::param");
}

TEST_CASE("every engine entry point refuses another spec's ids, in range or not, and stays usable") {
  const model_spec a = stack_spec(2, 0);
  const model_spec b = stack_spec(3, 0);  // ids 0..5; ids 0..3 are in range for a
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, a, stack_config());
    const model_spec& ours = eng.spec();
    CHECK(ours.serial() == a.serial());  // the engine's copy: a's ids work on it
    for (const param_id p : {b.param_by_name("b0.w"), b.param_by_name("b2.b")}) {
      check_foreign([&] { eng.gather_param(p); }, ours, b, "gather_param");
      check_foreign([&] { (void)eng.layout(p); }, ours, b, "layout");
      check_foreign([&] { eng.set_trainable(p, false); }, ours, b, "set_trainable");
      const std::vector<float> value(ours.params()[0].numel(), 1.0f);
      check_foreign([&] { eng.write_param(p, value, 0); }, ours, b, "write_param");
      check_foreign([&] { eng.gather_grad(p); }, ours, b, "gather_grad");
      check_foreign([&] { eng.gather_optimizer_state(p, state_field::m); }, ours, b, "gather_optimizer_state");
      check_foreign([&] { eng.write_optimizer_state(p, state_field::v, value, 0); }, ours, b, "write_optimizer_state");
      float x = 0;
      check_foreign([&] { eng.read_shard(p, state_field::working, 0, &x, 0); }, ours, b, "parameter state access");
      check_foreign([&] { eng.write_shard(p, state_field::master, 0, &x, 0); }, ours, b, "parameter state access");
      check_foreign([&] { (void)eng.shard_host_data(p, state_field::working); }, ours, b, "parameter state access");
      check_foreign([&] { (void)eng.spec().param(p); }, ours, b, "model_spec::param");
    }
    for (const module_id m : {b.module_by_name("b0"), b.module_by_name("b2")}) {
      check_foreign([&] { eng.forward(m); }, ours, b, "engine scope");
      check_foreign([&] { eng.forward(m, use_kind::no_grad); }, ours, b, "engine scope");
      check_foreign([&] { eng.recompute(m); }, ours, b, "engine scope");
      check_foreign([&] { eng.set_keep_gathered_until_backward(m, true); }, ours, b,
                    "set_keep_gathered_until_backward");
      check_foreign([&] { (void)eng.spec().module(m); }, ours, b, "model_spec::module");
    }
    // Inside backward, with a scope of the right model open.
    for (module_id m : a.module_ids()) eng.forward(m).close();
    eng.begin_backward();
    {
      auto g = eng.backward(a.module_by_name("b1"));
      check_foreign([&] { eng.backward(b.module_by_name("b0")); }, ours, b, "engine scope");
    }
    eng.backward(a.module_by_name("b0")).close();
    eng.end_backward();
    CHECK(eng.open_scopes() == 0);
    eng.step();
    // Still usable, and nothing changed by the refused calls: nothing frozen, every id of a
    // (bound or a bare index) works.
    for (param_id p : a.param_ids()) CHECK(eng.spec().param(p).trainable);
    for (param_id p : a.param_ids()) CHECK(eng.gather_param(p) == eng.gather_param(param_id{p.index()}));
  });
}

TEST_CASE("the planner and the schedule recorder refuse another spec's ids") {
  const model_spec a = stack_spec(2, 0);
  const model_spec b = stack_spec(2, 0);
  const module_id theirs = b.module_by_name("b1");

  plan::step_program prog;
  prog.events = {plan::schedule_event::open(theirs, plan::scope_kind::forward),
                 plan::schedule_event::close(theirs, plan::scope_kind::forward)};
  check_foreign([&] { prog.validate(a); }, a, b, "step program");
  prog.events = {plan::schedule_event::gather(b.param_by_name("b0.b"))};
  check_foreign([&] { prog.validate(a); }, a, b, "step program");

  plan::step_schedule steps;
  steps.modules.push_back({.module = theirs});
  check_foreign([&] { steps.validate(a); }, a, b, "step schedule");

  plan::schedule_recorder<> rec(a, stack_config(), 2);
  const model_spec& ours = rec.spec();
  check_foreign([&] { rec.forward(theirs); }, ours, b, "engine scope");
  check_foreign([&] { rec.gather_param(b.param_by_name("b0.w")); }, ours, b, "gather_param");
  check_foreign([&] { (void)rec.layout(b.param_by_name("b0.w")); }, ours, b, "layout");
  CHECK_FALSE(rec.step_open());  // nothing refused was recorded
  rec.forward(a.module_by_name("b0")).close();
  CHECK(rec.step_open());
}

TEST_CASE("two engines of two models in one process: each trains as alone, crossing their ids fails") {
  const model_spec student = named(stack_spec(3, 0), "student");  // 6 parameters
  const model_spec teacher = named(other_spec(), "teacher");      // 3: every id of it is in range for student
  constexpr int world = 2, steps = 3;

  // One optimizer step of `spec` on `eng`: every module forward, then backward in reverse with
  // gradients that depend on the step, the parameter and the element.
  auto train_step = [](auto& eng, const model_spec& spec, int step) {
    std::vector<module_id> order(spec.module_ids().begin(), spec.module_ids().end());
    for (module_id m : order) eng.forward(m).close();
    eng.begin_backward();
    for (std::size_t i = order.size(); i-- > 0;) {
      auto g = eng.backward(order[i]);
      for (std::size_t k = 0; k < g.param_count(); ++k)
        for (std::size_t j = 0; j < g.grad(k).numel(); ++j)
          g.grad_data(k)[j] += 0.01f * float((step + 1) * (k + 1)) - 0.003f * float(j % 7);
    }
    eng.end_backward();
    eng.step();
  };
  auto params_of = [](auto& eng, const model_spec& spec) {
    std::vector<std::vector<float>> out;
    for (param_id p : spec.param_ids()) out.push_back(eng.gather_param(p));
    return out;
  };
  engine_config cfg = stack_config();
  cfg.param_dtype = dtype::f32;

  // Each model alone: the reference.
  std::vector<std::vector<float>> student_alone, teacher_alone, student_initial;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, student, cfg);
    auto initial = params_of(eng, student);
    for (int s = 0; s < steps; ++s) train_step(eng, student, s);
    auto trained = params_of(eng, student);
    if (comm.rank() == 0) student_alone = trained, student_initial = initial;
  });
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, teacher, cfg);
    for (int s = 0; s < steps; ++s) train_step(eng, teacher, s);
    auto trained = params_of(eng, teacher);
    if (comm.rank() == 0) teacher_alone = trained;
  });
  REQUIRE(student_alone.size() == 6);
  CHECK(student_alone != student_initial);  // training moved the parameters

  // Both on the same ranks (a communicator each, split off the world), steps interleaved, each
  // engine handed the other's ids between steps and inside a backward.
  std::vector<std::vector<std::vector<float>>> got(2);
  run_ranks(world, [&](thread_comm& all) {
    thread_comm comm_s = all.split(0, all.rank());
    thread_comm comm_t = all.split(0, all.rank());
    host_backend bs, bt;
    engine<host_backend, thread_comm> es(bs, comm_s, student, cfg);
    engine<host_backend, thread_comm> et(bt, comm_t, teacher, cfg);
    for (int s = 0; s < steps; ++s) {
      train_step(et, teacher, s);
      check_foreign([&] { es.gather_param(teacher.param_by_name("w")); }, es.spec(), teacher, "gather_param");
      check_foreign([&] { es.forward(teacher.module_by_name("mix")); }, es.spec(), teacher, "engine scope");
      check_foreign([&] { (void)es.layout(teacher.param_by_name("gain")); }, es.spec(), teacher, "layout");
      train_step(es, student, s);
      check_foreign([&] { et.set_trainable(student.param_by_name("b0.b"), false); }, et.spec(), student,
                    "set_trainable");
      for (module_id m : student.module_ids())
        if (m.index() < teacher.modules().size())  // in range for the teacher: still refused
          check_foreign([&] { et.forward(m); }, et.spec(), student, "engine scope");
    }
    auto rs = params_of(es, student);
    auto rt = params_of(et, teacher);
    if (all.rank() == 0) got[0] = rs, got[1] = rt;
  });
  CHECK(got[0] == student_alone);
  CHECK(got[1] == teacher_alone);
}
