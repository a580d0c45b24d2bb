// export_hf (checkpoint/hf_export.hpp): the fixture's Llama loaded on 3 ranks and written back
// as a Hugging Face directory holds transformers' names, shapes and the bytes of the files it
// came from (bf16 -> f32 -> bf16 is exact), shards and an index as save_pretrained writes them,
// and the config it was read from; it loads again through load_hf; a tied model has no
// lm_head.weight; an export overwrites nothing. (That transformers itself loads such a
// directory and reproduces zshard's logits is checked by example_llama_transformers, when torch
// is installed.)
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "../checkpoint/test_dir.hpp"
#include "llama_fixture.hpp"
#include "zshard/checkpoint/hf_export.hpp"

namespace {

using namespace llama_fixture;
namespace fs = std::filesystem;
using engine_t = zshard::engine<zshard::host_backend, zshard::thread_comm>;


// Every tensor of the checkpoint in `dir`, by name: dtype, shape and bytes.
std::map<std::string, std::pair<ck::tensor_entry, std::vector<char>>> tensors_of(const std::string& dir) {
  ck::safetensors_source src(ck::checked_hf_weights(dir));
  std::map<std::string, std::pair<ck::tensor_entry, std::vector<char>>> out;
  for (const auto& l : src.tensors()) {
    std::vector<char> bytes(l.tensor->end - l.tensor->begin);
    l.file->read(*l.tensor, 0, l.tensor->numel(), bytes.data());
    out[l.tensor->name] = {*l.tensor, std::move(bytes)};
  }
  return out;
}

// The model of `from` on `world` ranks, exported to `to`.
void load_and_export(const std::string& from, const std::string& to, int world, const ck::hf_export_options& o) {
  const auto cfg = ck::read_hf_llama_config(from);
  const auto model = llama::make_zshard_model(cfg, 7);
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    engine_t eng(backend, comm, model.spec, engine_config());
    ck::load_hf(eng, from);
    ck::export_hf(eng, to, o);
  });
}

TEST_CASE("export_hf: the fixture's Llama written back from 3 ranks is the checkpoint it was read from") {
  ckpt_test::temp_dir t;
  const auto cfg = ck::read_hf_llama_config(model_dir(false));
  ck::hf_export_options o;
  o.type = zshard::dtype::bf16;
  o.max_shard_bytes = 64'000;
  o.config = cfg.to_json(o.type);
  load_and_export(model_dir(false), t / "out", 3, o);

  const auto want = tensors_of(model_dir(false)), got = tensors_of(t / "out");
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    const auto& g = got.at(name);
    CHECK(g.first.type == ck::file_dtype::bf16);
    CHECK(g.first.shape == w.first.shape);
    CHECK(g.second == w.second);
  }
  // shards of at most 64,000 bytes (save_pretrained's rule) with an index naming each tensor's
  const auto index = read_json(t / "out/model.safetensors.index.json");
  CHECK(index["metadata"]["total_size"] == 2 * 106816);
  CHECK(index["weight_map"].size() == want.size());
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  CHECK(shards.size() >= 4);
  for (const auto& s : shards) {
    INFO(s);
    CHECK(s.find("-of-0000" + std::to_string(shards.size()) + ".safetensors") != std::string::npos);
    CHECK(fs::file_size(t / ("out/" + s)) <= 64'000 + 4096);  // the data, and its header
  }
  // the config it was read from, with the dtype written
  auto written = read_json(t / "out/config.json"), original = read_json(model_dir(false) + "/config.json");
  CHECK(written == original);  // the fixture is bf16 already
  // nothing else in the directory, nothing left beside it
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(t / "out")) ++files;
  CHECK(files == shards.size() + 2);
  CHECK(!fs::exists(t / "out.zshard-export.tmp"));

  // f32, one file (it fits), read back through load_hf on 2 ranks: the same values
  o.type = zshard::dtype::f32;
  o.max_shard_bytes = 5'000'000'000;
  o.config = cfg.to_json(o.type);
  load_and_export(t / "out", t / "out32", 2, o);
  CHECK(fs::exists(t / "out32/model.safetensors"));
  CHECK(!fs::exists(t / "out32/model.safetensors.index.json"));
  CHECK(read_json(t / "out32/config.json")["dtype"] == "float32");
  const auto f32 = tensors_of(t / "out32");
  for (const auto& [name, w] : want) {
    INFO(name);
    const auto& g = f32.at(name);
    REQUIRE(g.first.type == ck::file_dtype::f32);
    std::vector<float> a(g.first.numel()), b(g.first.numel());
    std::memcpy(a.data(), g.second.data(), g.second.size());
    zshard::convert(w.second.data(), zshard::dtype::bf16, b.data(), zshard::dtype::f32, b.size());
    CHECK(a == b);
  }
}

TEST_CASE("export_hf: a tied model has no lm_head.weight; a directory in the way is refused") {
  ckpt_test::temp_dir t;
  const auto cfg = ck::read_hf_llama_config(model_dir(true));
  ck::hf_export_options o;
  o.type = zshard::dtype::f16;
  o.config = cfg.to_json(o.type);
  fs::create_directories(t / "out");  // empty: taken
  load_and_export(model_dir(true), t / "out/", 2, o);
  const auto got = tensors_of(t / "out"), want = tensors_of(model_dir(true));
  CHECK(got.count("lm_head.weight") == 0);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) CHECK(got.at(name).second == w.second);

  std::string msg[2];
  const auto model = llama::make_zshard_model(cfg, 7);
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    engine_t eng(backend, comm, model.spec, engine_config());
    try {
      ck::export_hf(eng, t / "out", o);
    } catch (const zshard::error& e) {
      msg[comm.rank()] = e.what();
    }
  });
  CHECK(msg[0] == msg[1]);
  CHECK(msg[0].find("exists and is not an empty directory") != std::string::npos);
  CHECK(tensors_of(t / "out").size() == want.size());  // untouched
}

TEST_CASE("export_hf: a parameter the name table does not name is refused before anything is written") {
  ckpt_test::temp_dir t;
  const auto cfg = ck::read_hf_llama_config(model_dir(true));
  const auto model = llama::make_zshard_model(cfg, 7);
  ck::hf_export_options o;
  o.names = ck::hf_name_table().add("embed.weight", "model.embed_tokens.weight");
  zshard::run_ranks(1, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    engine_t eng(backend, comm, model.spec, engine_config());
    CHECK_THROWS_WITH_AS(ck::export_hf(eng, t / "out", o),
                         doctest::Contains("no row of the name table names 'block0.attn_norm', 'block0.q'"),
                         zshard::error);
  });
  CHECK(!fs::exists(t / "out"));
}

}  // namespace
