// Checkpoints across layouts: a checkpoint saved under hybrid sharding (replicas x shard group)
// loads under plain ZeRO-3 at another world size and under another hybrid layout, and a plain
// ZeRO-3 checkpoint loads under hybrid sharding; every field comes back bit for bit and training
// goes on as the float64 single-process reference does. Only replica 0 writes: a hybrid save has
// one file per rank of a shard group.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;

namespace {

zshard::engine_config layout(int group) {
  auto c = engine_options(dtype::f32, 1, 8);
  c.hybrid.shard_group_size = group;
  return c;
}

int rank_files(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(ck::resolve_checkpoint(dir)))
    n += e.path().filename().string().rfind("rank-", 0) == 0;
  return n;
}

struct layout_shape {
  int world, group;  // group 0: plain ZeRO-3
};
std::string name(layout_shape s) {
  return s.group == 0 || s.group == s.world ? "ZeRO-3 on " + std::to_string(s.world)
                                            : std::to_string(s.world / s.group) + " x " + std::to_string(s.group);
}

}  // namespace

TEST_CASE("checkpoints move between hybrid and plain ZeRO-3 layouts of other world sizes") {
  const toy::config mc{};
  const auto reference = reference_params(layout(0));
  const layout_shape saves[] = {{4, 2}, {6, 3}, {3, 0}};
  const layout_shape loads[] = {{1, 0}, {3, 0}, {4, 2}, {8, 4}, {6, 2}};
  for (const layout_shape a : saves) {
    temp_dir dir;
    const full_state saved = on_ranks(a.world, layout(a.group), [&](auto& eng, const toy::ids& id) {
      train_steps(eng, id, mc, 0, 2, global_rows);
      ck::save(eng, dir.path());
      return gather_all(eng);
    });
    CHECK(rank_files(dir.path()) == (a.group == 0 ? a.world : a.group));  // one replica group wrote
    for (const layout_shape b : loads) {
      INFO("saved under " << name(a) << ", loaded under " << name(b));
      const loaded_then_trained r = load_and_train(b.world, layout(b.group), dir.path(), a.group == 0 ? a.world : a.group);
      CHECK(same_bits(r.loaded, saved));
      check_close(r.trained, reference);
    }
  }
}

TEST_CASE("hybrid exact resume: 2 steps, save, load, 2 steps equals 4 uninterrupted steps bit for bit") {
  const toy::config mc{};
  temp_dir dir;
  const auto cfg = layout(2);
  const full_state straight = on_ranks(6, cfg, [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 4, global_rows);
    return gather_all(eng);
  });
  on_ranks(6, cfg, [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 2, global_rows);
    ck::save(eng, dir.path());
    return 0;
  });
  const full_state resumed = on_ranks(6, cfg, [&](auto& eng, const toy::ids& id) {
    ck::load(eng, dir.path());
    train_steps(eng, id, mc, 2, 2, global_rows);
    return gather_all(eng);
  });
  CHECK(same_bits(resumed, straight));
}

TEST_CASE("export under hybrid sharding writes the same file as under plain ZeRO-3") {
  const toy::config mc{};
  temp_dir ckpt, out;
  on_ranks(4, layout(2), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 2, global_rows);
    ck::save(eng, ckpt.path());
    return 0;
  });
  const std::string hybrid_file = out.path() + "/hybrid.safetensors", flat_file = out.path() + "/flat.safetensors";
  on_ranks(6, layout(3), [&](auto& eng, const toy::ids&) {  // 2 x 3: replica 1 must not write
    ck::load(eng, ckpt.path());
    ck::export_engine(eng, hybrid_file);
    return 0;
  });
  on_ranks(3, layout(0), [&](auto& eng, const toy::ids&) {
    ck::load(eng, ckpt.path());
    ck::export_engine(eng, flat_file);
    return 0;
  });
  auto bytes = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string h = bytes(hybrid_file), f = bytes(flat_file);
  CHECK(!h.empty());
  CHECK(h == f);
}
