// A load reads nothing outside its checkpoint and never blocks: a name in the manifest other
// than one a save writes ("../..", an absolute path) is refused by name before anything is
// opened; a symbolic link in place of a rank file, the user state, the manifest, `latest` or
// the step directory is not followed; a FIFO in place of a file is refused at once instead of
// blocking the load forever. Each case is refused within a second, touching no path outside
// the checkpoint and with its memory unchanged (a 1 GiB sparse file named through "../" once
// cost +2 GB and 12.7 s). load_pretrained refuses an index naming a file outside its directory
// and a FIFO in a file's place; it follows links (the Hugging Face cache is made of them).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "ckpt_training.hpp"
#include "hostile_load.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
namespace fs = std::filesystem;

namespace contained_load {

// A checkpoint of a fresh 1-rank toy engine, with a user state, in dir; its step directory.
std::string save_one(const std::string& dir) {
  return ckpt_test::on_ranks(1, ckpt_test::engine_options(), [&](auto& eng, const toy::ids&) {
    return ck::save(eng, dir, {.user_state = "data position 42"}).path;
  });
}

struct hostile_case {
  const char* name;
  // Damages the checkpoint in `dir` (step directory `step`) using `outside`, a directory next
  // to it; returns the FIFOs it made.
  std::function<std::vector<std::string>(const std::string& dir, const std::string& step, const std::string& outside)>
      make;
  const char* error;  // what the refusal says
};

std::vector<std::string> fifo_at(const std::string& path) {
  fs::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return {path};
}
void link_out(const std::string& path, const std::string& outside) {  // the file moved out, a link left
  const std::string target = outside + "/" + fs::path(path).filename().string();
  fs::rename(path, target);
  fs::create_symlink(target, path);
}
// A 1 GiB sparse file outside, named by the manifest's user state as `name(outside)` with that size.
std::vector<std::string> user_state_names_big_file(const std::string& step, const std::string& outside,
                                                   const std::string& name) {
  const std::string big = outside + "/big.bin";
  { std::ofstream(big).put('\0'); }
  fs::resize_file(big, std::uintmax_t{1} << 30);
  hostile_load::edit_manifest(step, [&](nlohmann::ordered_json& j) {
    j["user_state"]["name"] = name;
    j["user_state"]["bytes"] = std::uint64_t{1} << 30;
  });
  return {};
}

const std::vector<hostile_case>& hostile_cases() {
  static const std::vector<hostile_case> cases = {
      {"user state named through '../' (a 1 GiB sparse file)",
       [](const std::string&, const std::string& step, const std::string& outside) {
         return user_state_names_big_file(step, outside, "../../" + fs::path(outside).filename().string() + "/big.bin");
       },
       "not 'user_state.bin' (the only name a save writes)"},
      {"user state named by an absolute path (a 1 GiB sparse file)",
       [](const std::string&, const std::string& step, const std::string& outside) {
         return user_state_names_big_file(step, outside, outside + "/big.bin");
       },
       "not 'user_state.bin' (the only name a save writes)"},
      {"symlinked rank file",
       [](const std::string&, const std::string& step, const std::string& outside) {
         link_out(step + "/rank-00000.safetensors", outside);
         return std::vector<std::string>{};
       },
       "rank-00000.safetensors' is a symbolic link"},
      {"symlinked user_state.bin",
       [](const std::string&, const std::string& step, const std::string& outside) {
         link_out(step + "/user_state.bin", outside);
         return std::vector<std::string>{};
       },
       "user_state.bin' is a symbolic link"},
      {"symlinked manifest.json",
       [](const std::string&, const std::string& step, const std::string& outside) {
         link_out(step + "/manifest.json", outside);
         return std::vector<std::string>{};
       },
       "manifest.json' is a symbolic link"},
      {"symlinked latest",
       [](const std::string& dir, const std::string&, const std::string& outside) {
         link_out(dir + "/latest", outside);
         return std::vector<std::string>{};
       },
       "latest' is a symbolic link"},
      {"symlinked step directory",
       [](const std::string&, const std::string& step, const std::string& outside) {
         link_out(step, outside);
         return std::vector<std::string>{};
       },
       "step-0000000000' is a symbolic link"},
      {"FIFO rank file",
       [](const std::string&, const std::string& step, const std::string&) {
         return fifo_at(step + "/rank-00000.safetensors");
       },
       "rank-00000.safetensors' is a FIFO, not a regular file"},
      {"FIFO manifest.json",
       [](const std::string&, const std::string& step, const std::string&) { return fifo_at(step + "/manifest.json"); },
       "manifest.json' is a FIFO, not a regular file"},
      {"FIFO user state",
       [](const std::string&, const std::string& step, const std::string&) {
         return fifo_at(step + "/user_state.bin");
       },
       "user_state.bin' is a FIFO, not a regular file"},
      {"FIFO latest",
       [](const std::string& dir, const std::string&, const std::string&) { return fifo_at(dir + "/latest"); },
       "latest' is a FIFO, not a regular file"},
  };
  return cases;
}

}  // namespace contained_load

TEST_CASE("a checkpoint as saved loads, every file it opens inside its directory") {
  ckpt_test::temp_dir dir;
  contained_load::save_one(dir.path());
  const auto o = hostile_load::load_watched(dir.path());
  CHECK(o.error == "");
  CHECK(o.opened.size() >= 4);  // latest, manifest, rank file, user state
  CHECK(hostile_load::stayed_inside(o, dir.path()));
}

TEST_CASE("names, links and FIFOs that lead out of a checkpoint or block are refused within a second") {
  for (const auto& c : contained_load::hostile_cases()) {
    CAPTURE(std::string(c.name));
    ckpt_test::temp_dir dir, outside;
    const std::string step = contained_load::save_one(dir.path());
    const auto fifos = c.make(dir.path(), step, outside.path());
    const auto o = hostile_load::load_watched(dir.path(), fifos);
    CAPTURE(o.error);
    CHECK(o.error.find(c.error) != std::string::npos);
    CHECK(o.seconds < 1.0);
    CHECK(o.peak_growth < (std::uint64_t{64} << 20));  // nothing of the 1 GiB file was read
    CHECK(hostile_load::stayed_inside(o, dir.path()));
    MESSAGE(std::string(c.name) << ": refused in " << o.seconds * 1e3 << " ms, peak memory +" << (o.peak_growth >> 10)
                                << " KiB");
  }
}

TEST_CASE("a checkpoint named directly may be reached through a link the user chose") {
  ckpt_test::temp_dir dir, elsewhere;
  const std::string step = contained_load::save_one(dir.path());
  const std::string link = elsewhere / "mine";
  fs::create_symlink(step, link);
  CHECK(hostile_load::load_watched(link).error == "");
}

namespace contained_load {
// A model file of the toy engine's parameters, and an index naming it as `file_name`.
void write_model_and_index(const std::string& dir, const std::string& file_name) {
  ckpt_test::on_ranks(1, ckpt_test::engine_options(), [&](auto& eng, const toy::ids&) {
    ck::export_engine(eng, dir + "/model.safetensors");
    nlohmann::json index;
    index["metadata"] = nlohmann::json::object();
    for (const auto& p : eng.spec().params()) index["weight_map"][p.name] = file_name;
    ck::write_small_file(dir + "/model.safetensors.index.json", index.dump());
    return 0;
  });
}
hostile_load::outcome pretrained_watched(const std::string& index, const std::vector<std::string>& fifos = {}) {
  return hostile_load::watched([&](auto& eng, const ck::io_hook&) { ck::load_pretrained(eng, index); }, fifos);
}
}  // namespace contained_load

TEST_CASE("load_pretrained: an index naming a file outside its directory, or a FIFO, is refused at once") {
  ckpt_test::temp_dir dir, outside;
  const std::string index = dir / "model.safetensors.index.json";
  contained_load::write_model_and_index(dir.path(), "model.safetensors");
  REQUIRE(contained_load::pretrained_watched(index).error == "");

  // a file next to the index, reached through a link (as in the Hugging Face cache): followed
  contained_load::link_out(dir / "model.safetensors", outside.path());
  CHECK(contained_load::pretrained_watched(index).error == "");

  // a name leading out of the index's directory, to a file that holds every tensor
  contained_load::write_model_and_index(dir.path(),
                                        "../" + fs::path(outside.path()).filename().string() + "/model.safetensors");
  auto o = contained_load::pretrained_watched(index);
  CHECK(o.error.find("which is not a file name in the index's directory") != std::string::npos);
  CHECK(o.seconds < 1.0);

  // a FIFO in the place of a file the index names
  contained_load::write_model_and_index(dir.path(), "shard.safetensors");
  const auto fifos = contained_load::fifo_at(dir / "shard.safetensors");
  o = contained_load::pretrained_watched(index, fifos);
  CHECK(o.error.find("shard.safetensors' is a FIFO, not a regular file") != std::string::npos);
  CHECK(o.seconds < 1.0);
}
