// The Hugging Face checkpoint loader (checkpoint/hf_checkpoint.hpp, hf_config.hpp) on copies of
// the fixture's tiny Llama, each changed in one way: every refusal names what is wrong, on every
// rank alike (2 thread ranks), before anything is loaded.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "../checkpoint/test_dir.hpp"
#include "llama_fixture.hpp"
#include "zshard/checkpoint/safetensors_writer.hpp"
#include "zshard/plan/hf_shape.hpp"

namespace {

using namespace llama_fixture;
namespace fs = std::filesystem;

// The fixture's tiny model copied into t (files only, no links).
std::string copy_tiny(const ckpt_test::temp_dir& t) {
  const std::string to = t / "tiny";
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(model_dir(false))) fs::copy_file(e.path(), to + "/" + e.path().filename().string());
  return to;
}


// Loads `dir` into a Llama of config `cfg` on 2 thread ranks; returns the error both ranks
// threw (they must agree), or "" when the load succeeded on both.
std::string load_error(const std::string& dir, const ck::hf_llama_config& cfg, const ck::hf_load_options& o = {}) {
  const llama::zshard_model model = llama::make_zshard_model(cfg, 7);
  std::string msg[2];
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, model.spec, engine_config());
    try {
      ck::load_hf(eng, dir, o);
    } catch (const zshard::error& e) {
      msg[comm.rank()] = e.what();
    }
  });
  CHECK(msg[0] == msg[1]);
  return msg[0];
}
std::string load_error(const std::string& dir) { return load_error(dir, ck::read_hf_llama_config(dir)); }

// One model.safetensors in `out` with the tiny model's tensors, each written as `types` says
// (default: as the shards hold it) and the `extra` tensors (f32 zeros of the given shapes) after them.
void write_single_file(const std::string& src, const std::string& out, const std::map<std::string, ck::file_dtype>& types,
                       const std::map<std::string, std::vector<std::int64_t>>& extra) {
  ck::safetensors_source in(src + "/" + ck::hf_index_name);
  std::vector<ck::planned_tensor> plan;
  for (const auto& l : in.tensors()) {
    const auto it = types.find(l.tensor->name);
    plan.push_back({l.tensor->name, it == types.end() ? l.tensor->type : it->second, l.tensor->shape});
  }
  for (const auto& [name, shape] : extra) plan.push_back({name, ck::file_dtype::f32, shape});
  ck::safetensors_writer w(out + "/" + ck::hf_single_name, plan, {{"format", "pt"}});
  for (const auto& l : in.tensors()) {
    const ck::tensor_entry& t = *l.tensor;
    std::vector<char> raw(t.end - t.begin);
    l.file->read(t, 0, t.numel(), raw.data());
    const auto it = types.find(t.name);
    if (it == types.end()) {
      w.write(raw.data(), raw.size());
      continue;
    }
    std::vector<float> f(t.numel());
    zshard::convert(raw.data(), *ck::param_dtype_of(t.type), f.data(), zshard::dtype::f32, f.size());
    REQUIRE(it->second == ck::file_dtype::f64);
    std::vector<double> d(f.begin(), f.end());
    w.write(d.data(), d.size() * sizeof(double));
  }
  for (const auto& [name, shape] : extra) {
    std::size_t n = 1;
    for (auto s : shape) n *= std::size_t(s);
    const std::vector<float> zeros(n, 0.0f);
    w.write(zeros.data(), n * sizeof(float));
  }
  w.finish();
}

TEST_CASE("hf loader: the fixture's sharded checkpoint loads on 2 ranks, by directory, index or file") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  CHECK(load_error(dir) == "");
  CHECK(load_error(dir + "/" + ck::hf_index_name, ck::read_hf_llama_config(dir)) == "");
  // one file, with the rotary_emb.inv_freq buffer older checkpoints carry (skipped by name)
  fs::create_directories(t / "single");
  fs::copy_file(dir + "/config.json", t / "single/config.json");
  write_single_file(dir, t / "single", {}, {{"model.layers.0.self_attn.rotary_emb.inv_freq", {8}}});
  CHECK(load_error(t / "single") == "");
}

TEST_CASE("hf loader: a tensor missing from the index is named, with its file name") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  auto index = read_json(dir + "/" + ck::hf_index_name);
  index["weight_map"].erase("model.layers.1.mlp.up_proj.weight");
  write_json(dir + "/" + ck::hf_index_name, index);
  const std::string msg = load_error(dir);
  CHECK(msg.find("missing: 'block1.up' (file name 'model.layers.1.mlp.up_proj.weight') [128, 64]") != std::string::npos);
}

TEST_CASE("hf loader: a model of another shape names every mis-shaped tensor") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  auto cfg = ck::read_hf_llama_config(dir);
  cfg.intermediate_size = 96;
  const std::string msg = load_error(dir, cfg);
  for (const char* s : {"mismatched: 'block0.gate' (file name 'model.layers.0.mlp.gate_proj.weight'): model [96, 64], "
                        "file [128, 64]",
                        "mismatched: 'block1.down' (file name 'model.layers.1.mlp.down_proj.weight'): model [64, 96], "
                        "file [64, 128]"}) {
    INFO(s);
    CHECK(msg.find(s) != std::string::npos);
  }
}

TEST_CASE("hf loader: a tensor of a dtype other than F32/BF16/F16, and an extra tensor, are named") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  fs::create_directories(t / "single");
  fs::copy_file(dir + "/config.json", t / "single/config.json");
  write_single_file(dir, t / "single", {{"model.norm.weight", ck::file_dtype::f64}},
                    {{"model.layers.0.self_attn.q_proj.bias", {64}}});
  const std::string msg = load_error(t / "single");
  CHECK(msg.find("mismatched: 'head.norm' (file name 'model.norm.weight'): dtype F64 is not F32/BF16/F16") !=
        std::string::npos);
  CHECK(msg.find("unexpected: 'model.layers.0.self_attn.q_proj.bias'") != std::string::npos);
}

TEST_CASE("hf loader: a shard missing from disk is named with the tensors the index puts in it") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  fs::remove(dir + "/model-00003-of-00004.safetensors");
  const std::string msg = load_error(dir);
  INFO(msg);
  CHECK(msg.find("names the shard 'model-00003-of-00004.safetensors' (holding 'model.layers.1.input_layernorm.weight', "
                 "'model.layers.1.mlp.down_proj.weight', 'model.layers.1.mlp.gate_proj.weight' and 5 more)") !=
        std::string::npos);
  CHECK(msg.find("which is missing from '" + dir + "'") != std::string::npos);
}

TEST_CASE("hf loader: an index naming a file outside its directory is refused") {
  ckpt_test::temp_dir t;
  const std::string dir = copy_tiny(t);
  const std::string shard = "model-00002-of-00004.safetensors";
  fs::copy_file(dir + "/" + shard, t / shard);  // a real file, one level up
  const auto original = read_json(dir + "/" + ck::hf_index_name);
  for (const std::string& outside : {"../" + shard, t / shard, "sub/" + shard, std::string("..")}) {
    auto index = original;
    for (auto& [name, file] : index["weight_map"].items())
      if (file == shard) file = outside;
    write_json(dir + "/" + ck::hf_index_name, index);
    INFO(outside);
    const std::string msg = load_error(dir);
    CHECK(msg.find("names the shard '" + outside + "', which is not a file name of the checkpoint's directory") !=
          std::string::npos);
  }
  // a link in the directory, to the file outside it
  write_json(dir + "/" + ck::hf_index_name, original);
  fs::remove(dir + "/" + shard);
  fs::create_symlink(t / shard, dir + "/" + shard);
  const std::string msg = load_error(dir);
  CHECK(msg.find("names the shard '" + shard + "', which is a symbolic link") != std::string::npos);
  CHECK(msg.find("cp -rL") != std::string::npos);
  // followed when asked (the Hugging Face cache's snapshot folders hold links into blobs/)
  CHECK(load_error(dir, ck::read_hf_llama_config(dir), {.follow_links = true}) == "");
  // a FIFO in a shard's place is refused at once, never waited on
  fs::remove(dir + "/" + shard);
  REQUIRE(::mkfifo((dir + "/" + shard).c_str(), 0600) == 0);
  const std::string fifo = load_error(dir);
  CHECK(fifo.find("is a FIFO, not a regular file") != std::string::npos);
}

TEST_CASE("hf config: what zshard's Llama cannot compute is refused by name") {
  const auto base = read_json(model_dir(false) + "/config.json");
  const auto refused = [&](const char* key, nlohmann::json value, const std::string& text) {
    auto j = base;
    j[key] = value;
    INFO(std::string(key) << " = " << value.dump());
    try {
      ck::parse_hf_llama_config(j.dump(), "config.json");
      FAIL("accepted");
    } catch (const zshard::error& e) {
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  refused("model_type", "mistral", "model_type is \"mistral\"");
  refused("attention_bias", true, "attention_bias / mlp_bias is true");
  refused("hidden_act", "gelu", "hidden_act is \"gelu\"");
  refused("num_key_value_heads", 3, "not a multiple of num_key_value_heads 3");
  refused("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000.0}}, "RoPE type \"yarn\"");
  refused("hidden_size", -64, "\"hidden_size\" is -64");
  // transformers v4's spelling of the same config reads the same
  auto v4 = base;
  v4.erase("rope_parameters");
  v4["rope_theta"] = 10000.0;
  v4["torch_dtype"] = "bfloat16";
  v4.erase("dtype");
  const auto a = ck::parse_hf_llama_config(base.dump(), "v5"), b = ck::parse_hf_llama_config(v4.dump(), "v4");
  CHECK(a.rope_theta == b.rope_theta);
  CHECK(a.inv_freq() == b.inv_freq());
  CHECK(a.dtype_name == "bfloat16");
  CHECK(b.dtype_name == "bfloat16");
}

TEST_CASE("hf config: Llama 3.1 70B's config.json is the planner's llama3-70b shape") {
  // the file as published (transformers v4 spelling), its keys that matter here
  const auto cfg = ck::parse_hf_llama_config(R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
      "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 8192,
      "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 131072, "mlp_bias": false,
      "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
      "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})",
                                             "llama-3.1-70b/config.json");
  const auto shape = zshard::plan::transformer_shape_of(cfg, "llama-3.1-70b");
  const auto want = zshard::plan::llama3_70b();
  CHECK(shape.layers == want.layers);
  CHECK(shape.hidden == want.hidden);
  CHECK(shape.intermediate == want.intermediate);
  CHECK(shape.heads == want.heads);
  CHECK(shape.kv_heads == want.kv_heads);
  CHECK(shape.vocab == want.vocab);
  CHECK(shape.tied_embeddings == want.tied_embeddings);
  CHECK(shape.param_count() == want.param_count());
  CHECK(cfg.llama3_rope);
  CHECK(cfg.rms_norm_eps == 1e-5);
  // and zshard's Llama of that config has the planner's parameter count (without building it:
  // its spec is only shapes)
  const auto model = llama::make_zshard_model(cfg, 1);
  CHECK(model.spec.total_numel() == std::size_t(want.param_count()));
}

}  // namespace
