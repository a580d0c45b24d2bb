// Pretrained weights in (safetensors, one file or an index, mixed dtypes, a name map) and the
// model out (export from an engine or from a checkpoint), against values computed here; every
// mismatch reported at once with the engine untouched; host memory during a load bounded by
// the chunk, in the ledger.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "../support/error_capture.hpp"
#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;

namespace {

struct file_tensor {
  std::string name;
  ck::file_dtype type;
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // exactly representable in `type`
};

// Random values, rounded to the file dtype so that the file holds exactly these.
std::vector<file_tensor> toy_tensors(const toy::config& mc, std::uint64_t seed, const std::string& prefix = "") {
  zshard::model_spec spec;
  toy::ids id;
  spec = toy::make_spec(mc, id);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::vector<file_tensor> out;
  int k = 0;
  for (const auto& p : spec.params()) {
    file_tensor t;
    t.name = prefix + p.name;
    t.type = k % 3 == 0 ? ck::file_dtype::bf16 : k % 3 == 1 ? ck::file_dtype::f16 : ck::file_dtype::f32;
    ++k;
    for (int i = 0; i < p.shape.rank(); ++i) t.shape.push_back(p.shape[i]);
    for (std::size_t i = 0; i < p.numel(); ++i) {
      float v = nd(rng);
      if (t.type == ck::file_dtype::bf16) v = zshard::to_float(zshard::to_bf16(v));
      if (t.type == ck::file_dtype::f16) v = zshard::to_float(zshard::to_f16(v));
      t.values.push_back(v);
    }
    out.push_back(std::move(t));
  }
  return out;
}

void write_file(const std::string& path, const std::vector<file_tensor>& ts) {
  std::vector<ck::planned_tensor> plan;
  for (const auto& t : ts) plan.push_back({t.name, t.type, t.shape});
  ck::safetensors_writer w(path, plan);
  for (const auto& t : ts) {
    std::vector<char> bytes(t.values.size() * ck::size_of(t.type));
    zshard::convert(t.values.data(), dtype::f32, bytes.data(), *ck::param_dtype_of(t.type), t.values.size());
    w.write(bytes.data(), bytes.size());
  }
  w.finish();
}

}  // namespace

TEST_CASE("pretrained: mixed-dtype file into bf16 and f32 engines at several world sizes; master exact, working rounded") {
  temp_dir dir;
  const toy::config mc{};
  const auto ts = toy_tensors(mc, 5);
  write_file(dir / "model.safetensors", ts);
  for (dtype t : {dtype::f32, dtype::bf16})
    for (int world : {1, 3, 8}) {
      INFO(zshard::to_string(t) << ", world " << world);
      const full_state s = on_ranks(world, engine_options(t), [&](auto& eng, const toy::ids&) {
        const auto rep = ck::load_pretrained(eng, dir / "model.safetensors", {.chunk_bytes = 200});
        CHECK(rep.loaded == ts.size());
        return gather_all(eng);
      });
      std::size_t trainable = 0;
      for (std::size_t p = 0; p < ts.size(); ++p) {
        std::vector<float> rounded(ts[p].values.size());
        for (std::size_t i = 0; i < rounded.size(); ++i)
          rounded[i] = t == dtype::bf16 ? zshard::to_float(zshard::to_bf16(ts[p].values[i])) : ts[p].values[i];
        CHECK(s.working[p] == rounded);
        if (ts[p].name == "s0") continue;  // frozen: no master
        CHECK(s.master[trainable] == ts[p].values);
        CHECK(s.m[trainable] == std::vector<float>(ts[p].values.size(), 0.f));
        ++trainable;
      }
    }
}

TEST_CASE("pretrained: a Hugging Face index over two files, names mapped by a table and by a function") {
  temp_dir dir;
  const toy::config mc{};
  const auto ts = toy_tensors(mc, 9, "model.");
  write_file(dir / "model-00001-of-00002.safetensors", {ts.begin(), ts.begin() + 4});
  write_file(dir / "model-00002-of-00002.safetensors", {ts.begin() + 4, ts.end()});
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  for (std::size_t i = 0; i < ts.size(); ++i)
    index += (i ? "," : "") + std::string("\"") + ts[i].name + "\": \"model-0000" + (i < 4 ? "1" : "2") + "-of-00002.safetensors\"";
  ck::write_small_file(dir / "model.safetensors.index.json", index + "}}");
  std::map<std::string, std::string> table;
  for (const auto& t : ts) table[t.name.substr(6)] = t.name;
  const full_state a = on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    ck::load_pretrained(eng, dir / "model.safetensors.index.json", {.rename = table});
    return gather_all(eng);
  });
  const full_state b = on_ranks(4, engine_options(), [&](auto& eng, const toy::ids&) {
    ck::load_pretrained(eng, dir / "model.safetensors.index.json",
                        {.name_map = [](const std::string& n) { return "model." + n; }});
    return gather_all(eng);
  });
  CHECK(same_bits(a, b));
  for (std::size_t p = 0; p < ts.size(); ++p) CHECK(a.working[p] == ts[p].values);
}

TEST_CASE("pretrained: missing, unexpected and mismatched tensors in one error; the engine untouched") {
  temp_dir dir;
  const toy::config mc{.name = "student"};
  auto ts = toy_tensors(mc, 3);
  ts.erase(ts.begin() + 2);                                                    // W0 missing
  ts.push_back({"lm_head.extra", ck::file_dtype::f32, {2}, {1.f, 2.f}});       // unexpected
  ts[0].shape = {8, 13};                                                       // E transposed
  write_file(dir / "bad.safetensors", ts);
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    const full_state before = gather_all(eng);
    const std::string w = test_support::message_of([&] { ck::load_pretrained(eng, dir / "bad.safetensors"); });
    CHECK(w.find("does not match the model (model_spec 'student' (#") != std::string::npos);
    CHECK(w.find("missing: 'W0'") != std::string::npos);
    CHECK(w.find("unexpected: 'lm_head.extra'") != std::string::npos);
    CHECK(w.find("mismatched: 'E': model [13, 8], file [8, 13]") != std::string::npos);
    CHECK(w.find("bad.safetensors") != std::string::npos);
    CHECK(same_bits(before, gather_all(eng)));
    // extra tensors can be allowed; the missing one still fails
    CHECK_THROWS_WITH_AS(ck::load_pretrained(eng, dir / "bad.safetensors", {.allow_unexpected = true}),
                         doctest::Contains("missing: 'W0'"), zshard::error);
    return 0;
  }, mc);
}

TEST_CASE("pretrained: the ledger's host peak during a load stays within the chunk, however large the model") {
  temp_dir dir;
  // one large parameter (1 Mi elements, 4 MiB in f32) and a 64 KiB chunk
  zshard::model_spec spec;
  const auto w = spec.add_param("big", {1024, 1024});
  spec.add_module("m", {w});
  {
    ck::safetensors_writer wr(dir / "big.safetensors", {{"big", ck::file_dtype::bf16, {1024, 1024}}});
    std::vector<std::uint16_t> row(1024);
    for (int r = 0; r < 1024; ++r) {
      for (int c = 0; c < 1024; ++c) row[std::size_t(c)] = zshard::to_bf16(float(r - c) * 1e-3f).bits;
      wr.write(row.data(), row.size() * 2);
    }
    wr.finish();
  }
  constexpr std::size_t chunk = 64 << 10;
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, engine_options());
    backend.ledger().reset_peaks();
    const std::size_t before = backend.ledger().total_current();
    ck::load_pretrained(eng, dir / "big.safetensors", {.chunk_bytes = chunk});
    CHECK(backend.ledger().total_peak() - before <= chunk);
    CHECK(backend.ledger().peak(zshard::mem_category::scratch) <= chunk + 8192);  // the agreement's blocks are smaller
    CHECK(backend.ledger().total_current() == before);
    // the rank's own shard arrived: spot-check an element
    const auto& l = eng.layout(0);
    const std::size_t g = l.owned_begin(comm.rank()) + 7;
    float x;
    eng.read_shard(0, zshard::state_field::master, 7, &x, 1);
    CHECK(x == zshard::to_float(zshard::to_bf16(float(int(g / 1024) - int(g % 1024)) * 1e-3f)));
  });
}

TEST_CASE("staging: a small model's load, save and export take what its largest piece needs, not the whole default chunk") {
  temp_dir dir;
  // 40 x 24 parameters (960 elements), two ranks: 480 each; the default chunk is 64 MiB
  zshard::model_spec spec;
  const auto w = spec.add_param("w", {40, 24});
  const auto b = spec.add_param("b", {24});
  spec.add_module("m", {w, b});
  {
    ck::safetensors_writer wr(dir / "small.safetensors",
                              {{"w", ck::file_dtype::bf16, {40, 24}}, {"b", ck::file_dtype::f16, {24}}});
    std::vector<std::uint16_t> bits(40 * 24);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = zshard::to_bf16(float(i) * 1e-3f).bits;
    wr.write(bits.data(), bits.size() * 2);
    for (std::size_t i = 0; i < 24; ++i) bits[i] = zshard::to_f16(float(i) * 1e-2f).bits;
    wr.write(bits.data(), 24 * 2);
    wr.finish();
  }
  // the largest piece: 480 bf16 elements widened to f32 and written back as f32 (10 bytes each),
  // a few KiB; the agreements' own blocks are smaller than 8 KiB
  constexpr std::size_t bound = 480 * 10 + 16 * 10 + 8192;
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, engine_options());
    const auto staged = [&](const std::string& what, auto&& op) {
      INFO(what);
      backend.ledger().reset_peaks();
      const std::size_t before = backend.ledger().current(zshard::mem_category::scratch);
      op();
      CHECK(backend.ledger().peak(zshard::mem_category::scratch) - before <= bound);
      CHECK(backend.ledger().current(zshard::mem_category::scratch) == before);
    };
    staged("load_pretrained", [&] { ck::load_pretrained(eng, dir / "small.safetensors"); });
    staged("export_engine", [&] { ck::export_engine(eng, dir / "out.safetensors", {.type = dtype::bf16}); });
    staged("save", [&] { ck::save(eng, dir / "ckpt"); });
    staged("load", [&] { ck::load(eng, dir / "ckpt"); });
    // what went through the small chunk arrived whole: an element of each parameter, back from the export
    ck::safetensors_file out(dir / "out.safetensors");
    std::vector<std::uint16_t> got(40 * 24);
    REQUIRE(out.find("w"));
    out.read(*out.find("w"), 0, got.size(), got.data());
    CHECK(got[123] == zshard::to_bf16(123e-3f).bits);
    CHECK(got[959] == zshard::to_bf16(959e-3f).bits);
  });
}

TEST_CASE("export: engine to one file (f32 exact, bf16 rounded), and a checkpoint to the same bytes") {
  temp_dir dir;
  const toy::config mc{};
  for (dtype out : {dtype::f32, dtype::bf16}) {
    INFO(zshard::to_string(out));
    std::vector<std::vector<float>> gathered;
    on_ranks(3, engine_options(), [&](auto& eng, const toy::ids& id) {
      train_steps(eng, id, mc, 0, 2);
      ck::export_engine(eng, dir / "engine.safetensors", {.type = out, .chunk_bytes = 128});
      ck::save(eng, dir / "ckpt");
      std::vector<std::vector<float>> g;
      for (zshard::param_id p = 0; p < eng.spec().params().size(); ++p) g.push_back(eng.gather_param(p));
      if (eng.comm().rank() == 0) gathered = g;
      return 0;
    });
    ck::export_checkpoint(dir / "ckpt", dir / "ckpt.safetensors", {.type = out, .chunk_bytes = 100});
    CHECK(ck::read_small_file(dir / "engine.safetensors") == ck::read_small_file(dir / "ckpt.safetensors"));
    ck::safetensors_file f(dir / "engine.safetensors");
    toy::ids id;
    const auto spec = toy::make_spec(mc, id);
    REQUIRE(f.header().tensors.size() == spec.params().size());
    for (std::size_t p = 0; p < spec.params().size(); ++p) {
      const auto* t = f.find(spec.params()[p].name);
      REQUIRE(t);
      CHECK(t->type == ck::file_dtype_of(out));
      std::vector<char> raw(t->end - t->begin);
      f.read(*t, 0, t->numel(), raw.data());
      std::vector<float> got(t->numel());
      zshard::convert(raw.data(), out, got.data(), dtype::f32, got.size());
      std::vector<float> want = gathered[p];
      if (out == dtype::bf16)
        for (float& v : want) v = zshard::to_float(zshard::to_bf16(v));
      CHECK(got == want);
    }
    std::filesystem::remove_all(dir / "ckpt");
  }
}

TEST_CASE("export: a write failure leaves no output file and fails every rank") {
  temp_dir dir;
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    const int rank = eng.comm().rank();
    ck::export_options o;
    o.hook = [rank](const ck::io_event& e) { return rank == 1 && e.call == ck::io_call::write && e.offset > 200 ? EIO : 0; };
    o.chunk_bytes = 64;
    CHECK_THROWS_WITH_AS(ck::export_engine(eng, dir / "out.safetensors", o), doctest::Contains("Input/output error"),
                         zshard::error);
    return 0;
  });
  CHECK(!std::filesystem::exists(dir / "out.safetensors"));
}
