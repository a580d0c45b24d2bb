// Parameters whose files hold their transpose (param_options::file_transposed: a linear weight
// kept as (in, out) appears in exports as torch's (out, in)). Exports from an engine at any
// world size and chunk, and from a checkpoint on disk, hold element (i, j) at j * rows + i with
// the shape reversed; load_pretrained reads the same layout back; the blocks the copies move
// cover a rank's range exactly once.
#include <cerrno>
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>

#include "ckpt_training.hpp"
#include "test_dir.hpp"
#include "zshard/checkpoint/transposed_copy.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;

namespace {

// w (9 x 40, transposed in files), e (6 x 3, as is), b (40): values from the element index.
struct layout_model {
  zshard::model_spec spec;
  zshard::param_id w, e, b;
  zshard::module_id m;
};
float value_of(int param, std::int64_t i, float salt) { return float(param * 1000 + i) * 0.01f + salt; }
layout_model make_model(float salt) {
  layout_model lm;
  lm.w = lm.spec.add_param("w", {9, 40}, {.init = [=](std::int64_t i) { return value_of(0, i, salt); },
                                          .file_transposed = true});
  lm.e = lm.spec.add_param("e", {6, 3}, {.init = [=](std::int64_t i) { return value_of(1, i, salt); }});
  lm.b = lm.spec.add_param("b", {40}, {.init = [=](std::int64_t i) { return value_of(2, i, salt); }});
  lm.m = lm.spec.add_module("all", {lm.w, lm.e, lm.b});
  return lm;
}

template <class Fn>
void on_layout_ranks(int world, float salt, zshard::dtype type, Fn&& fn) {
  const layout_model lm = make_model(salt);
  zshard::engine_config cfg = engine_options(type);
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, lm.spec, cfg);
    fn(eng, lm);
  });
}

// The f32 tensors of a safetensors file by name, with their shapes.
std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> read_all(const std::string& path) {
  ck::safetensors_file f(path);
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> out;
  for (const char* name : {"w", "e", "b"}) {
    const ck::tensor_entry* t = f.find(name);
    REQUIRE(t);
    std::vector<float> v(t->numel());
    if (t->type == ck::file_dtype::f32) {
      f.read(*t, 0, t->numel(), v.data());
    } else {
      std::vector<std::uint16_t> raw(t->numel());
      f.read(*t, 0, t->numel(), raw.data());
      zshard::convert(raw.data(), zshard::dtype::bf16, v.data(), zshard::dtype::f32, raw.size());
    }
    out[name] = {t->shape, v};
  }
  return out;
}

void check_torch_layout(const std::string& path, float salt, zshard::dtype type) {
  const auto t = read_all(path);
  const auto round = [&](float x) { return type == zshard::dtype::bf16 ? zshard::to_float(zshard::to_bf16(x)) : x; };
  CHECK(t.at("w").first == std::vector<std::int64_t>{40, 9});  // (out, in)
  CHECK(t.at("e").first == std::vector<std::int64_t>{6, 3});
  CHECK(t.at("b").first == std::vector<std::int64_t>{40});
  bool all = true;
  for (std::int64_t i = 0; i < 9; ++i)
    for (std::int64_t j = 0; j < 40; ++j) all = all && t.at("w").second[std::size_t(j * 9 + i)] == round(value_of(0, i * 40 + j, salt));
  CHECK(all);
  for (std::int64_t k = 0; k < 18; ++k) all = all && t.at("e").second[std::size_t(k)] == round(value_of(1, k, salt));
  CHECK(all);
}

}  // namespace

TEST_CASE("blocks of a transposed copy cover a rank's range once, in order, within the chunk") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::uint64_t rows = 1 + rng() % 9, cols = 1 + rng() % 13, n = rows * cols;
    const std::uint64_t b = rng() % (n + 1), e = b + rng() % (n - b + 1), max = 1 + rng() % 40;
    std::uint64_t next = b;
    bool ok = true;
    ck::for_each_block(cols, b, e, max, [&](const ck::matrix_block& k) {
      ok = ok && k.rows() >= 1 && k.cols() >= 1 && k.rows() * k.cols() <= max && k.j1 <= cols;
      ok = ok && (k.rows() == 1 || (k.j0 == 0 && k.j1 == cols));  // whole rows, or a piece of one
      ok = ok && k.i0 * cols + k.j0 == next;                        // in order, no gap, no overlap
      next = (k.i1 - 1) * cols + k.j1;
    });
    CHECK_MESSAGE((ok && next == e), "rows " << rows << " cols " << cols << " [" << b << ", " << e << ") max " << max);
  }
}

TEST_CASE("export writes file_transposed weights as (out, in) at any world size and chunk; the tool agrees") {
  for (const zshard::dtype type : {zshard::dtype::f32, zshard::dtype::bf16}) {
    for (const int world : {1, 3, 7}) {
      for (const std::size_t chunk : {std::size_t{192}, std::size_t{64} << 20}) {  // pieces of rows; whole rows
        CAPTURE(world);
        CAPTURE(chunk);
        temp_dir dir;
        on_layout_ranks(world, 0.5f, zshard::dtype::f32, [&](auto& eng, const layout_model&) {
          ck::export_engine(eng, dir / "engine.safetensors", {.type = type, .chunk_bytes = chunk});
          ck::save(eng, dir / "ckpt");
        });
        check_torch_layout(dir / "engine.safetensors", 0.5f, type);
        ck::export_checkpoint(dir / "ckpt", dir / "tool.safetensors", {.type = type, .chunk_bytes = chunk});
        const auto a = read_all(dir / "engine.safetensors"), b = read_all(dir / "tool.safetensors");
        CHECK(a == b);
      }
    }
  }
}

TEST_CASE("load_pretrained reads file_transposed weights back from (out, in), at any world size") {
  temp_dir dir;
  on_layout_ranks(2, 0.25f, zshard::dtype::f32, [&](auto& eng, const layout_model&) {
    ck::export_engine(eng, dir / "model.safetensors");
  });
  for (const int world : {1, 3, 7}) {
    for (const std::size_t chunk : {std::size_t{256}, std::size_t{64} << 20}) {
      CAPTURE(world);
      std::mutex mu;
      std::vector<std::vector<float>> got;
      on_layout_ranks(world, 9.0f, zshard::dtype::bf16, [&](auto& eng, const layout_model& lm) {
        ck::load_pretrained(eng, dir / "model.safetensors", {.chunk_bytes = chunk});
        std::vector<std::vector<float>> v{eng.gather_param(lm.w), zshard::gather_field(eng, lm.w, zshard::state_field::master),
                                          eng.gather_param(lm.e)};
        if (eng.comm().rank() == 0) {
          std::lock_guard lock(mu);
          got = std::move(v);
        }
      });
      REQUIRE(got.size() == 3);
      bool ok = true;
      for (std::int64_t i = 0; i < 360; ++i) {
        const float want = value_of(0, i, 0.25f);
        ok = ok && got[1][std::size_t(i)] == want && got[0][std::size_t(i)] == zshard::to_float(zshard::to_bf16(want));
      }
      for (std::int64_t i = 0; i < 18; ++i) ok = ok && got[2][std::size_t(i)] == zshard::to_float(zshard::to_bf16(value_of(1, i, 0.25f)));
      CHECK(ok);
    }
  }
}

TEST_CASE("a file in the model's own (in, out) layout is refused for a file_transposed weight, naming both shapes") {
  temp_dir dir;
  {
    ck::safetensors_writer w(dir / "in_out.safetensors", {{"w", ck::file_dtype::f32, {9, 40}},
                                                          {"e", ck::file_dtype::f32, {6, 3}},
                                                          {"b", ck::file_dtype::f32, {40}}});
    std::vector<float> zeros(360, 0.0f);
    w.write(zeros.data(), 360 * 4);
    w.write(zeros.data(), 18 * 4);
    w.write(zeros.data(), 40 * 4);
    w.finish();
  }
  on_layout_ranks(2, 0.0f, zshard::dtype::f32, [&](auto& eng, const layout_model&) {
    try {
      ck::load_pretrained(eng, dir / "in_out.safetensors");
      FAIL("loaded");
    } catch (const zshard::error& e) {
      CHECK(std::string(e.what()).find("'w': model [9, 40], held transposed, so the file should hold [40, 9], file [9, 40]") !=
            std::string::npos);
    }
  });
}

TEST_CASE("file_transposed is for 2-D parameters; manifests record it, older ones read as off") {
  zshard::model_spec s;
  CHECK_THROWS_WITH_AS((void)s.add_param("v", {4}, {.file_transposed = true}),
                       doctest::Contains("parameter 'v' has file_transposed set but shape [4]"), zshard::error);
  temp_dir dir;
  std::string path;
  on_layout_ranks(2, 0.0f, zshard::dtype::f32, [&](auto& eng, const layout_model&) {
    const auto s = ck::save(eng, dir.path());
    if (eng.comm().rank() == 0) path = s.path;
  });
  std::ifstream in(path + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto m = ck::manifest::parse(text, "manifest.json");
  CHECK(m.params[0].file_transposed);
  CHECK_FALSE(m.params[1].file_transposed);
  CHECK(text.find("\"file_transposed\"") == text.rfind("\"file_transposed\""));  // written once: only where set
}

TEST_CASE("a checkpoint saved before file_transposed was set loads into the model that sets it, bit for bit") {
  temp_dir dir;
  // the "old" model: the same parameters, w without the flag
  zshard::model_spec old_spec;
  const auto w = old_spec.add_param("w", {9, 40}, {.init = [](std::int64_t i) { return value_of(0, i, 3.0f); }});
  const auto e = old_spec.add_param("e", {6, 3});
  const auto b = old_spec.add_param("b", {40});
  old_spec.add_module("all", {w, e, b});
  zshard::run_ranks(3, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, old_spec, engine_options());
    ck::save(eng, dir.path());
  });
  std::mutex mu;
  std::vector<float> got;
  on_layout_ranks(2, 0.0f, zshard::dtype::f32, [&](auto& eng, const layout_model& lm) {
    ck::load(eng, dir.path());
    auto v = eng.gather_param(lm.w);
    std::lock_guard lock(mu);
    got = std::move(v);
  });
  REQUIRE(got.size() == 360);
  bool ok = true;
  for (std::int64_t i = 0; i < 360; ++i) ok = ok && got[std::size_t(i)] == value_of(0, i, 3.0f);
  CHECK(ok);
}

TEST_CASE("an export that fails leaves no temporary file behind, from an engine or a checkpoint") {
  temp_dir dir;
  std::filesystem::create_directories(dir / "out");  // the output names a directory: refused
  on_layout_ranks(3, 0.0f, zshard::dtype::f32, [&](auto& eng, const layout_model&) {
    CHECK_THROWS_WITH_AS(ck::export_engine(eng, dir / "out"), doctest::Contains("is a directory"), zshard::error);
    // a full disk on rank 1 in the middle of the write phase: every rank fails, rank 0 cleans up
    const int rank = eng.comm().rank();
    ck::export_options o;
    o.hook = [rank](const ck::io_event& e) {
      return rank == 1 && e.call == ck::io_call::write && e.path.ends_with("data.safetensors") ? ENOSPC : 0;
    };
    CHECK_THROWS_WITH_AS(ck::export_engine(eng, dir / "model.safetensors", o), doctest::Contains("No space left"),
                         zshard::error);
    ck::save(eng, dir / "ckpt");
  });
  CHECK_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  CHECK_THROWS_WITH_AS(ck::export_checkpoint(dir / "ckpt", dir / "out"), doctest::Contains("is a directory"), zshard::error);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    CHECK_MESSAGE(entry.path().filename().string().find(".tmp") == std::string::npos, entry.path());
}
