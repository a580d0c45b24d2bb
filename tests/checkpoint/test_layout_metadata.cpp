// An export records its layout: "__metadata__" "zshard_transposed" lists the tensors it holds as
// the transpose of the model's parameter (param_options::file_transposed). load_pretrained
// checks it against the loading model's registration, so that a square weight exported in
// (out, in) no longer loads transposed, without a word, into a model registered without
// file_transposed (nor the reverse): an error names the tensor. A file without the key (other
// tools) loads as the model says, as before; check_file_layout = false trusts the model alone.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;

namespace layout_metadata_test {

// "q" (6 x 6, square) transposed in files when `transposed`, and "bias" (6): values from the index.
struct square_model {
  zshard::model_spec spec;
  zshard::param_id q, bias;
};
square_model make(bool transposed, float salt) {
  square_model m;
  m.q = m.spec.add_param("q", {6, 6},
                         {.init = [=](std::int64_t i) { return float(i) + salt; }, .file_transposed = transposed});
  m.bias = m.spec.add_param("bias", {6}, {.init = [=](std::int64_t i) { return float(-i) - salt; }});
  m.spec.add_module("all", {m.q, m.bias});
  return m;
}

// On 2 ranks of the model registered as `transposed`: fn(engine); rank 0's result.
template <class Fn>
auto on_square_ranks(bool transposed, float salt, Fn&& fn) {
  const square_model sm = make(transposed, salt);
  decltype(fn(std::declval<zshard::engine<zshard::host_backend, zshard::thread_comm>&>())) out{};
  std::mutex mu;
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, sm.spec, ckpt_test::engine_options());
    auto r = fn(eng);
    std::lock_guard lock(mu);
    if (comm.rank() == 0) out = std::move(r);
  });
  return out;
}

// The error load_pretrained(path) gives a model registered as `transposed` ("" when it loads),
// and "q" as loaded.
std::pair<std::string, std::vector<float>> load_into(bool transposed, const std::string& path,
                                                     const ck::pretrained_options& o = {}) {
  return on_square_ranks(transposed, 100.0f, [&](auto& eng) {
    std::string e;
    try {
      ck::load_pretrained(eng, path, o);
    } catch (const zshard::error& x) {
      e = x.what();
    }
    return std::make_pair(e, eng.gather_param(0));
  });
}

std::vector<float> q_values(float salt) {
  std::vector<float> v(36);
  for (int i = 0; i < 36; ++i) v[std::size_t(i)] = float(i) + salt;
  return v;
}
std::vector<float> transposed_6x6(const std::vector<float>& v) {
  std::vector<float> t(36);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) t[std::size_t(j * 6 + i)] = v[std::size_t(i * 6 + j)];
  return t;
}

// `from` rewritten with `metadata` instead of its own (the same tensors and bytes).
void rewrite_metadata(const std::string& from, const std::string& to,
                      const std::map<std::string, std::string>& metadata) {
  const ck::safetensors_file f(from);
  std::vector<ck::planned_tensor> plan;
  for (const auto& t : f.header().tensors) plan.push_back({t.name, t.type, t.shape});
  ck::safetensors_writer w(to, plan, metadata);
  for (const auto& t : f.header().tensors) {
    std::vector<char> bytes(t.end - t.begin);
    f.read_bytes(t.begin, bytes.data(), bytes.size());
    w.write(bytes.data(), bytes.size());
  }
  w.finish();
}

}  // namespace layout_metadata_test

TEST_CASE("exports record which tensors they hold transposed, from an engine and from a checkpoint") {
  ckpt_test::temp_dir dir;
  for (const bool transposed : {true, false}) {
    layout_metadata_test::on_square_ranks(transposed, 0.0f, [&](auto& eng) {
      ck::export_engine(eng, dir / "engine.safetensors");
      ck::save(eng, dir / "ckpt");
      return 0;
    });
    ck::export_checkpoint(dir / "ckpt", dir / "tool.safetensors");
    for (const char* file : {"engine.safetensors", "tool.safetensors"}) {
      const ck::safetensors_file f(dir / file);
      CHECK(f.header().metadata.at("format") == "pt");
      CHECK(f.header().metadata.at("zshard_transposed") == (transposed ? R"(["q"])" : "[]"));
    }
  }
}

TEST_CASE("a square weight exported in one layout is refused by a model registered with the other, naming it") {
  ckpt_test::temp_dir dir;
  for (const bool written : {true, false}) {
    CAPTURE(written);
    const std::string file = dir / (written ? "out_in.safetensors" : "in_out.safetensors");
    layout_metadata_test::on_square_ranks(written, 0.0f, [&](auto& eng) {
      ck::export_engine(eng, file);
      return 0;
    });
    // the same registration loads the values as they were
    const auto same = layout_metadata_test::load_into(written, file);
    CHECK(same.first == "");
    CHECK(same.second == layout_metadata_test::q_values(0.0f));
    // the other is refused, naming the tensor, and leaves the engine as it was
    const auto other = layout_metadata_test::load_into(!written, file);
    CAPTURE(other.first);
    CHECK(other.first.find("mismatched: 'q': the file holds ") != std::string::npos);
    CHECK(other.first.find(written ? "lists it: the model that wrote it registered it with file_transposed), this "
                                     "model registers it without: it would load transposed"
                                   : "does not list it), this model registers it with file_transposed: it would "
                                     "load transposed") != std::string::npos);
    CHECK(other.first.find("'bias'") == std::string::npos);  // only what differs
    CHECK(other.second == layout_metadata_test::q_values(100.0f));
    // a model that keeps the other layout on purpose: the registration alone decides
    const auto trusted = layout_metadata_test::load_into(!written, file, {.check_file_layout = false});
    CHECK(trusted.first == "");
    CHECK(trusted.second == layout_metadata_test::transposed_6x6(layout_metadata_test::q_values(0.0f)));
  }
}

TEST_CASE("a file without the layout key (other tools) loads as the model registers it; a bad value is refused") {
  ckpt_test::temp_dir dir;
  layout_metadata_test::on_square_ranks(true, 0.0f, [&](auto& eng) {
    ck::export_engine(eng, dir / "export.safetensors");
    return 0;
  });
  layout_metadata_test::rewrite_metadata(dir / "export.safetensors", dir / "plain.safetensors", {{"format", "pt"}});
  // read as the model says, either way (what the file holds cannot be told)
  CHECK(layout_metadata_test::load_into(true, dir / "plain.safetensors").second ==
        layout_metadata_test::q_values(0.0f));
  CHECK(layout_metadata_test::load_into(false, dir / "plain.safetensors").second ==
        layout_metadata_test::transposed_6x6(layout_metadata_test::q_values(0.0f)));
  for (const char* bad : {"q", R"({"q": 1})", "[1]", "[[[\"q\"]]]"}) {
    CAPTURE(bad);
    layout_metadata_test::rewrite_metadata(dir / "export.safetensors", dir / "bad.safetensors",
                                           {{"format", "pt"}, {"zshard_transposed", bad}});
    CHECK(layout_metadata_test::load_into(true, dir / "bad.safetensors")
              .first.find("bad.safetensors' is not a valid safetensors file: its metadata \"zshard_transposed\" is "
                          "not a JSON array of tensor names") != std::string::npos);
  }
}
