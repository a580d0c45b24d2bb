// zshard_export: a sharded zshard checkpoint to one safetensors file, tensor by tensor through
// one bounded chunk (no engine, no ranks: any machine that sees the files can run it).
//
//   zshard_export CHECKPOINT OUT.safetensors [--dtype f32|bf16] [--source working|master] [--chunk-mib N]
//
// CHECKPOINT is a step-* directory or a directory of checkpoints (its `latest` is used). Every
// rank file's checksum is verified first. Exit status: 0 written, 2 bad input (message on stderr).
#include <cstdio>
#include <string>

#include "zshard/checkpoint/export.hpp"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: zshard_export CHECKPOINT OUT.safetensors [--dtype f32|bf16] [--source working|master] "
               "[--chunk-mib N]\n"
               "  CHECKPOINT  a step-* directory, or a directory whose `latest` names one\n"
               "  --dtype     element type of the output (default f32)\n"
               "  --source    working: the values the model computes with (default); master: the f32\n"
               "              master copy of trainable parameters\n"
               "  --chunk-mib host memory the export moves data through (default 64)\n");
}

}  // namespace

int main(int argc, char** argv) try {
  std::string in, out;
  zshard::checkpoint::export_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else if (a == "--dtype") {
      const std::string v = value();
      if (v == "f32") o.type = zshard::dtype::f32;
      else if (v == "bf16") o.type = zshard::dtype::bf16;
      else throw std::invalid_argument("--dtype must be f32 or bf16, got '" + v + "'");
    } else if (a == "--source") {
      const std::string v = value();
      if (v == "working") o.source = zshard::state_field::working;
      else if (v == "master") o.source = zshard::state_field::master;
      else throw std::invalid_argument("--source must be working or master, got '" + v + "'");
    } else if (a == "--chunk-mib") {
      const long n = std::stol(value());
      if (n < 1) throw std::invalid_argument("--chunk-mib must be at least 1");
      o.chunk_bytes = std::size_t(n) << 20;
    } else if (!a.empty() && a[0] == '-') {
      throw std::invalid_argument("unknown option '" + a + "' (try --help)");
    } else if (in.empty()) {
      in = a;
    } else if (out.empty()) {
      out = a;
    } else {
      throw std::invalid_argument("unexpected argument '" + a + "'");
    }
  }
  if (in.empty() || out.empty()) {
    usage();
    return 2;
  }
  zshard::checkpoint::export_checkpoint(in, out, o);
  std::printf("exported %s -> %s (%s)\n", in.c_str(), out.c_str(), std::string(zshard::to_string(o.type)).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "zshard_export: %s\n", e.what());
  return 2;
}
