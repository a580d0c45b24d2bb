// The C++ side of the Python checks (tests/checkpoint/python/roundtrip.py):
//   python_bridge export DIR   trains the toy model 2 steps on 3 ranks, exports DIR/export_f32 and
//                              DIR/export_bf16.safetensors, and writes the engine's gathered
//                              parameters to DIR/gathered.json (9 significant digits: exact f32)
//   python_bridge load DIR     loads DIR/model.safetensors.index.json (written by Python,
//                              names "model.<name>") into a 3-rank engine and writes the
//                              gathered parameters (working and master) to DIR/loaded.json
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: python_bridge export|load DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
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
