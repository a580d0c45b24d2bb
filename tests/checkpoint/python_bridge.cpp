// The C++ side of the Python checks (tests/checkpoint/python/roundtrip.py):
//   python_bridge export DIR   trains the toy model 2 steps on 3 ranks, exports DIR/export_f32 and
//                              DIR/export_bf16.safetensors, and writes the engine's gathered
//                              parameters to DIR/gathered.json (9 significant digits: exact f32)
//   python_bridge load DIR     loads DIR/model.safetensors.index.json (written by Python,
//                              names "model.<name>") into a 3-rank engine and writes the
//                              gathered parameters (working and master) to DIR/loaded.json
//   python_bridge gpt DIR      the example GPT (examples/gpt) trained 1 step on 3 ranks, exported
//                              to DIR/gpt.safetensors (torch layout: linear weights (out, in)),
//                              and each linear layer's output for a fixed input, computed by the
//                              model's own layer code: DIR/gpt_layers.json
//   python_bridge gpt-load DIR loads DIR/gpt_torch.safetensors (written by Python in torch layout)
//                              into a fresh GPT engine, as --init-from does, and writes the same
//                              layer outputs to DIR/gpt_loaded_layers.json
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "../../examples/gpt/corpus.hpp"
#include "../../examples/gpt/zshard_gpt.hpp"
#include "../engine/toy_training.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/state/param_access.hpp"

namespace {

zshard::engine_config options() {
  zshard::engine_config c;
  c.adamw.lr = 1e-2f;
  c.partition.persistence_threshold_numel = 8;
  c.log = [](const std::string&) {};
  return c;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f.precision(9);
  f << j.dump();
  if (!f) throw std::runtime_error("cannot write " + path);
}

// The GPT modes: every linear weight of the model with its bias (none for the head).
struct linear_layer {
  std::string weight, bias;
};
std::vector<linear_layer> gpt_linears(const gpt::gpt_config& c) {
  std::vector<linear_layer> out;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "block" + std::to_string(l);
    for (const char* n : {".attn.qkv", ".attn.proj", ".mlp.fc", ".mlp.proj"}) out.push_back({b + n + ".weight", b + n + ".bias"});
  }
  out.push_back({"head.weight", ""});
  return out;
}

// For each linear layer: a fixed input x [4, in] and y = x W + b from the model's own code
// (gpt::layers::linear_forward over the gathered (in, out) weight).
template <class Engine>
nlohmann::json layer_outputs(Engine& eng, const gpt::gpt_config& c) {
  nlohmann::json j;
  for (const auto& l : gpt_linears(c)) {
    const auto& spec = eng.spec();
    const auto wp = spec.param_by_name(l.weight);
    const auto& shape = spec.params()[wp].shape;
    const auto in = shape[0], out = shape[1];
    const std::vector<float> w = eng.gather_param(wp);
    std::vector<float> b;
    if (!l.bias.empty()) b = eng.gather_param(spec.param_by_name(l.bias));
    gpt::mat<float> x(4, in), y;
    for (gpt::index r = 0; r < x.rows(); ++r)
      for (gpt::index k = 0; k < in; ++k) x(r, k) = float(std::sin(0.37 * double(r * in + k) + 0.1));
    gpt::layers::linear_forward<float>(x, w.data(), b.empty() ? nullptr : b.data(), out, y);
    j[l.weight] = {{"x", std::vector<float>(x.data(), x.data() + x.size())},
                   {"y", std::vector<float>(y.data(), y.data() + y.size())},
                   {"in", in},
                   {"out", out},
                   {"bias", l.bias}};
  }
  return j;
}

int run_gpt(const std::string& mode, const std::string& dir) {
  const gpt::gpt_config c{.vocab = 64, .seq_len = 8, .d_model = 16, .n_heads = 2, .n_layers = 1, .d_ff = 24};
  const gpt::zshard_model model = gpt::make_zshard_model(c, 7);
  const gpt::corpus data = gpt::corpus::synthetic(7, c.vocab);
  using engine_t = zshard::engine<zshard::host_backend, zshard::thread_comm>;
  nlohmann::json out;
  std::mutex mu;
  zshard::run_ranks(3, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    engine_t eng(backend, comm, model.spec, options());
    if (mode == "gpt") {
      gpt::zshard_gpt_runner<engine_t> runner(eng, model, false);
      runner.train_micro_batch(data.get_rows(0, comm.rank() * 2, 2, c.seq_len));
      eng.step();
      zshard::checkpoint::export_engine(eng, dir + "/gpt.safetensors");
    } else {
      zshard::checkpoint::load_pretrained(eng, dir + "/gpt_torch.safetensors");
    }
    nlohmann::json j = layer_outputs(eng, c);
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      out = std::move(j);
    }
  });
  write_json(dir + (mode == "gpt" ? "/gpt_layers.json" : "/gpt_loaded_layers.json"), out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: python_bridge export|load DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  if (mode == "gpt" || mode == "gpt-load") return run_gpt(mode, dir);
  const toy::config mc{};
  nlohmann::json out;
  std::mutex mu;
  zshard::run_ranks(3, [&](zshard::thread_comm& comm) {
    toy::ids id;
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, toy::make_spec(mc, id), options());
    if (mode == "export") {
      for (int step = 0; step < 2; ++step) {
        const toy::batch g = toy::make_batch(mc.vocab, std::uint64_t(step), 9);
        toy::run_micro_batch(eng, mc, id, toy::slice(g, comm.rank() * 3, 3), false);
        eng.step();
      }
      zshard::checkpoint::export_engine(eng, dir + "/export_f32.safetensors", {.type = zshard::dtype::f32});
      zshard::checkpoint::export_engine(eng, dir + "/export_bf16.safetensors", {.type = zshard::dtype::bf16});
    } else if (mode == "load") {
      zshard::checkpoint::load_pretrained(eng, dir + "/model.safetensors.index.json",
                                          {.name_map = [](const std::string& n) { return "model." + n; }});
    } else {
      throw std::invalid_argument("unknown mode " + mode);
    }
    nlohmann::json j;
    for (zshard::param_id p = 0; p < eng.spec().params().size(); ++p) {
      const auto& ps = eng.spec().params()[p];
      j[ps.name]["working"] = eng.gather_param(p);
      if (ps.trainable) j[ps.name]["master"] = zshard::gather_field(eng, p, zshard::state_field::master);
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      out = std::move(j);
    }
  });
  write_json(dir + (mode == "export" ? "/gathered.json" : "/loaded.json"), out);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "python_bridge: %s\n", e.what());
  return 2;
}
