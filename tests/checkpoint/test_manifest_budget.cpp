// Parse memory of a manifest: what a manifest may hold is derived from the model being loaded
// (checkpoint/manifest.hpp: manifest_budget), and a manifest beyond it is refused before it is
// read (bytes) or before a DOM of it is built (nesting depth, number of values), quickly and
// with bounded memory. 20 MB of nested arrays under an unknown key once cost +1.5 GB and 16 s
// and were then accepted. A safetensors header nested deeper than its format is refused alike.
#include <doctest/doctest.h>

#include <string>

#include "ckpt_training.hpp"
#include "hostile_load.hpp"
#include "raw_safetensors.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;

namespace manifest_budget_test {

// A checkpoint of the 1-rank toy engine whose manifest gains `"junk": <value>` (sealed again).
std::string checkpoint_with_junk(const std::string& dir, const std::string& value) {
  const std::string step = ckpt_test::on_ranks(1, ckpt_test::engine_options(),
                                               [&](auto& eng, const toy::ids&) { return ck::save(eng, dir).path; });
  hostile_load::edit_manifest_text(step, [&](std::string& text) {
    text.erase(text.find_last_of('}'));
    text += ",\n \"junk\": " + value + "\n}";
  });
  return step;
}
std::string nested_arrays(std::size_t bytes) { return std::string(bytes / 2, '[') + std::string(bytes / 2, ']'); }
std::string flat_array(std::size_t values) {
  std::string s = "[0";
  for (std::size_t i = 1; i < values; ++i) s += ",0";
  return s + "]";
}

}  // namespace manifest_budget_test

TEST_CASE("a manifest beyond what the model's checkpoint can hold is refused fast, with bounded memory") {
  struct junk_case {
    const char* name;
    std::string value;
    std::string error;
    double seconds = 1.0;  // at most
  };
  toy::ids id;
  const auto budget = ck::manifest_budget::for_model(toy::make_spec({}, id));
  const junk_case cases[] = {
      {"20 MB of nested arrays", manifest_budget_test::nested_arrays(20'000'000),  // refused unread
       "bytes, more than the " + std::to_string(budget.max_bytes) + " a manifest of this model can have"},
      {"2 MB of nested arrays", manifest_budget_test::nested_arrays(2'000'000),
       "nests arrays or objects deeper than the 4 levels its format has"},
      // walked value by value up to the budget (~527,000 here): 15-30 ms in a release build, over a
      // second under TSan on a busy machine; its memory stays the text's
      {"an array of 1,000,000 numbers", manifest_budget_test::flat_array(1'000'000),
       "values (keys, arrays, objects, scalars) its format can hold here", 10.0},
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.name));
    ckpt_test::temp_dir dir;
    manifest_budget_test::checkpoint_with_junk(dir.path(), c.value);
    const auto o = hostile_load::load_watched(dir.path());
    CAPTURE(o.error);
    CHECK(o.error.find("manifest.json' is not a valid zshard checkpoint manifest") != std::string::npos);
    CHECK(o.error.find(c.error) != std::string::npos);
    CHECK(o.seconds < c.seconds);
    CHECK(o.peak_growth < (std::uint64_t{48} << 20));
    MESSAGE(std::string(c.name) << ": refused in " << o.seconds * 1e3 << " ms, peak memory +" << (o.peak_growth >> 10)
                                << " KiB");
  }
}

TEST_CASE("a manifest with room to spare still loads: an unknown key within the budget is accepted") {
  ckpt_test::temp_dir dir;
  manifest_budget_test::checkpoint_with_junk(dir.path(), R"({"note": [1, 2, 3], "by": "a tool"})");
  CHECK(hostile_load::load_watched(dir.path()).error == "");
}

TEST_CASE("the budget grows with the model: more parameters, more bytes and values allowed") {
  const auto small = ck::manifest_budget::for_params(10, 20), large = ck::manifest_budget::for_params(10'000, 20);
  CHECK(large.max_bytes > small.max_bytes + 10'000 * 640);
  CHECK(large.json.max_values > small.json.max_values + 10'000 * 32);
  CHECK(small.json.max_depth == 4);
  // a real manifest of the model fits the model's budget
  ckpt_test::temp_dir dir;
  const std::string step = manifest_budget_test::checkpoint_with_junk(dir.path(), "0");
  const std::string text = ck::read_small_file(step + "/manifest.json");
  toy::ids id;
  const auto b = ck::manifest_budget::for_model(toy::make_spec({}, id));
  CHECK(text.size() < b.max_bytes);
  CHECK_NOTHROW(ck::manifest::parse(text, "manifest.json", b));
}

TEST_CASE("a safetensors header nested deeper than its format is refused before it is parsed") {
  ckpt_test::temp_dir dir;
  const std::string path = dir / "deep.safetensors";
  const std::string header = R"({"__metadata__": {"x": )" + manifest_budget_test::nested_arrays(2'000'000) + "}}";
  ck::write_small_file(path, ckpt_test::raw_file(header, {}));
  CHECK(ckpt_test::open_error(path).find("the header nests arrays or objects deeper than the 3 levels") !=
        std::string::npos);
}
