// The safetensors reader against files that are wrong the ways real ones get wrong: a header
// length off by a few bytes (every tensor would be read shifted), holes, overlaps and trailing
// bytes in the data, shapes whose byte size wraps around, every dtype the format defines, and
// thousands of random mutations of a valid file — each one either reads exactly the original
// values or is refused with an error naming the file; none crashes, hangs or reads shifted or
// foreign bytes. (A header edited at two points into another valid file, a byte removed and the
// length fixed to match, may declare the same bytes as another float dtype: "BF16" -> "F16".
// The format has no checksum that could tell; such files are counted apart.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ckpt_training.hpp"
#include "raw_safetensors.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;

namespace {

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
// A safetensors file of tensors given by dtype name, laid out back to back in the order given,
// the header padded to a multiple of 8 bytes (as writers do).
struct raw_tensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string data;
};
std::string safetensors_bytes(const std::vector<raw_tensor>& ts, const std::map<std::string, std::string>& meta = {}) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!meta.empty()) j["__metadata__"] = meta;
  std::uint64_t at = 0;
  std::string data;
  for (const auto& t : ts) {
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.data.size()}}};
    at += t.data.size();
    data += t.data;
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return raw_file(text, data);
}

}  // namespace

TEST_CASE("safetensors: a header length 1-7 bytes short (its padding eaten) is refused, not read shifted") {
  temp_dir dir;
  const std::string p = dir / "shift.safetensors";
  // the padding writers add so that the data starts 8-byte aligned
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})" +
      std::string(7, ' ');
  const std::vector<float> v = {1.5f, -2.f, 3.25f, 4.f};
  ck::write_small_file(p, raw_file(json, bytes_of(v)));
  {
    ck::safetensors_file f(p);
    std::vector<float> got(2);
    f.read(*f.find("b"), 0, 2, got.data());
    CHECK(got == std::vector<float>{3.25f, 4.f});
  }
  for (std::uint64_t k = 1; k <= 7; ++k) {
    INFO("header length " << json.size() << " - " << k);
    ck::write_small_file(p, raw_file(json, bytes_of(v), json.size() - k));
    const std::string e = open_error(p);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find(std::to_string(k) + " trailing data bytes after the last tensor 'b' (data_offsets [8, 16])") !=
          std::string::npos);
  }
}

TEST_CASE("safetensors: an element count times dtype size that wraps is refused ([2^31, 2^31] F32, empty offsets)") {
  temp_dir dir;
  const std::string p = dir / "wrap.safetensors";
  struct bad_case {
    std::string json, expect;
  };
  const std::vector<bad_case> cases = {
      // 2^62 elements of 4 bytes: 2^64 bytes, 0 after wrapping, which would match [0, 0]
      {R"({"big":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})",
       "tensor 'big': shape [2147483648,2147483648] of F32 overflows"},
      {R"({"big":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", "of F64 overflows"},
      {R"({"big":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", "overflows"},
      {R"({"big":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})",
       "shape has a bad dimension 9223372036854775808"},
      {R"({"big":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", "shape has a bad dimension -1"},
      {R"({"big":{"dtype":"U8","shape":[2.0],"data_offsets":[0,0]}})", "shape has a bad dimension 2.0"},
  };
  for (const auto& c : cases) {
    INFO(c.json);
    ck::write_small_file(p, raw_file(c.json, ""));
    const std::string e = open_error(p);
    CHECK(e.find(c.expect) != std::string::npos);
    CHECK(e.find(p) != std::string::npos);
  }
  // a zero dimension without overflow is an empty tensor, which is valid
  ck::write_small_file(p, raw_file(R"({"e":{"dtype":"F32","shape":[2147483648,0],"data_offsets":[0,0]}})", ""));
  CHECK(open_error(p).empty());
}

TEST_CASE("safetensors: the tensors must cover the data exactly; holes, overlaps and trailing bytes are refused") {
  temp_dir dir;
  const std::string p = dir / "cover.safetensors";
  auto t = [](const std::string& name, std::uint64_t b, std::uint64_t e, const std::string& dt = "U8") {
    return "\"" + name + "\":{\"dtype\":\"" + dt + "\",\"shape\":[" + std::to_string(e - b) + "],\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  struct bad_case {
    std::string json;
    std::size_t data;
    std::string expect;
  };
  const std::vector<bad_case> cases = {
      {"{" + t("a", 0, 8) + "," + t("b", 12, 20) + "}", 20,
       "data bytes [8, 12) belong to no tensor: a hole between tensor 'a' (data_offsets [0, 8]) and tensor 'b' "
       "(data_offsets [12, 20])"},
      {"{" + t("a", 4, 12) + "}", 12, "data bytes [0, 4) belong to no tensor: a hole before tensor 'a' (data_offsets [4, 12])"},
      {"{" + t("a", 0, 8) + "," + t("b", 4, 12) + "}", 12,
       "tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap"},
      {"{" + t("a", 0, 8) + "," + t("b", 0, 8) + "}", 8, "'a' (data_offsets [0, 8]) and 'b' (data_offsets [0, 8]) overlap"},
      {"{" + t("a", 0, 8) + "," + t("z", 4, 4) + "}", 8, "'a' (data_offsets [0, 8]) and 'z' (data_offsets [4, 4]) overlap"},
      {"{" + t("a", 0, 8) + "}", 9, "1 trailing data bytes after the last tensor 'a' (data_offsets [0, 8])"},
      {"{}", 4, "4 trailing data bytes after the header (no tensors)"},
      {"{" + t("a", 0, 8) + "}", 7, "tensor 'a': data_offsets [0, 8] ends past the 7 data bytes the file holds"},
  };
  for (const auto& c : cases) {
    INFO(c.json << " + " << c.data << " data bytes");
    ck::write_small_file(p, raw_file(c.json, std::string(c.data, '\x07')));
    const std::string e = open_error(p);
    CHECK(e.find(c.expect) != std::string::npos);
    CHECK(e.find(p) != std::string::npos);
  }
  // valid: out of order in the JSON, empty tensors at boundaries, no tensors and no data
  ck::write_small_file(
      p, raw_file("{" + t("b", 8, 12) + "," + t("z", 8, 8) + "," + t("a", 0, 8) + "," + t("y", 12, 12) + "}",
                  std::string(12, '\x07')));
  CHECK(open_error(p).empty());
  ck::write_small_file(p, raw_file("{}", ""));
  CHECK(open_error(p).empty());
  // the header length itself: too short for an object, or not at a JSON object
  ck::write_small_file(p, raw_file("", "", 0));
  CHECK(open_error(p).find("header length 0 is too short") != std::string::npos);
  ck::write_small_file(p, raw_file(" {}", ""));
  CHECK(open_error(p).find("does not start with '{'") != std::string::npos);
}

TEST_CASE("safetensors: every dtype the format defines is parsed with its size; packed ones fill whole bytes") {
  temp_dir dir;
  const std::string p = dir / "dtypes.safetensors";
  const std::vector<std::pair<std::string, std::size_t>> bits = {
      {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
      {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32},        {"F32", 32},        {"F64", 64},    {"I64", 64},    {"U64", 64},
      {"C64", 64},    {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6}};
  for (const auto& [name, b] : bits) {
    INFO(name);
    const std::size_t bytes = 8 * b / 8;  // 8 elements
    auto json = [&](std::size_t n) {
      return R"({"t":{"dtype":")" + name + R"(","shape":[2,4],"data_offsets":[0,)" + std::to_string(n) + "]}}";
    };
    ck::write_small_file(p, raw_file(json(bytes), std::string(bytes, '\x01')));
    REQUIRE(open_error(p).empty());
    ck::safetensors_file f(p);
    CHECK(std::string(ck::safetensors_name(f.find("t")->type)) == name);
    ck::write_small_file(p, raw_file(json(bytes + 1), std::string(bytes + 1, '\x01')));
    CHECK(open_error(p).find("need " + std::to_string(bytes)) != std::string::npos);
  }
  // 3 elements of 4 bits: a byte and a half
  ck::write_small_file(p, raw_file(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", "\x01"));
  CHECK(open_error(p).find("3 elements of F4 (4 bits each) are not a whole number of bytes") != std::string::npos);
}

namespace {

// A model's tensors (F32, exact) plus extra tensors of other dtypes, as Hugging Face files carry.
struct mixed_file {
  std::vector<std::vector<float>> values;  // per model parameter
};
mixed_file write_mixed(const std::string& path, const std::string& replace_with_i64 = "") {
  toy::ids id;
  const zshard::model_spec spec = toy::make_spec(toy::config{}, id);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 0.5f);
  mixed_file out;
  std::vector<raw_tensor> ts;
  for (const auto& p : spec.params()) {
    std::vector<std::int64_t> shape;
    for (int i = 0; i < p.shape.rank(); ++i) shape.push_back(p.shape[i]);
    std::vector<float> v(p.numel());
    for (float& x : v) x = nd(rng);
    out.values.push_back(v);
    if (p.name == replace_with_i64)
      ts.push_back({p.name, "I64", shape, std::string(v.size() * 8, '\x02')});
    else
      ts.push_back({p.name, "F32", shape, bytes_of(v)});
  }
  ts.push_back({"position_ids", "I64", {1, 16}, std::string(128, '\x03')});
  ts.push_back({"attention_mask", "BOOL", {16}, std::string(16, '\x01')});
  ts.push_back({"lm_head.scale", "F8_E4M3", {3}, "abc"});
  ts.push_back({"packed", "F4", {6}, "xyz"});
  ts.push_back({"rope.inv_freq", "F64", {4}, std::string(32, '\x04')});
  ck::write_small_file(path, safetensors_bytes(ts, {{"format", "pt"}}));
  return out;
}

}  // namespace

TEST_CASE("pretrained: extra tensors of any dtype are skipped with allow_unexpected; an expected non-float one is refused") {
  temp_dir dir;
  const mixed_file mf = write_mixed(dir / "hf.safetensors");
  const full_state s = on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    const auto rep = ck::load_pretrained(eng, dir / "hf.safetensors", {.allow_unexpected = true});
    CHECK(rep.loaded == mf.values.size());
    auto unexpected = rep.unexpected;
    std::sort(unexpected.begin(), unexpected.end());
    CHECK(unexpected ==
          std::vector<std::string>{"attention_mask", "lm_head.scale", "packed", "position_ids", "rope.inv_freq"});
    return gather_all(eng);
  });
  CHECK(s.working == mf.values);
  // without allow_unexpected: the extra tensors are named, not a parse error
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    CHECK_THROWS_WITH_AS(ck::load_pretrained(eng, dir / "hf.safetensors"),
                         doctest::Contains("unexpected: 'position_ids'"), zshard::error);
    return 0;
  });
  // a parameter whose tensor is I64: refused by name and dtype, the engine untouched
  write_mixed(dir / "int.safetensors", "W0");
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    const full_state before = gather_all(eng);
    CHECK_THROWS_WITH_AS(ck::load_pretrained(eng, dir / "int.safetensors", {.allow_unexpected = true}),
                         doctest::Contains("mismatched: 'W0': dtype I64 is not F32/BF16/F16"), zshard::error);
    CHECK(same_bits(before, gather_all(eng)));
    return 0;
  });
}

namespace {

// What a loader gets from a mutated file: refused (by the reader, or because a tensor the model
// needs is missing, of a non-float dtype or of another shape), the original values, or the
// original bytes declared as another float dtype of the same size: a header edited into a
// different valid file ("BF16" -> "F16" with the length fixed to match), which no reader can
// tell from a real one; only the mutations that fix the length can make one.
enum class outcome { refused, original, redeclared, wrong };

struct reference_file {
  std::string bytes;
  std::uint64_t data_start = 0;
  struct tensor {
    std::string name;
    ck::file_dtype type;
    std::vector<std::int64_t> shape;
    std::string data;
  };
  std::vector<tensor> floats;  // the tensors a model would load
};

// with_others: also an I64 and a BOOL tensor, as Hugging Face files carry.
reference_file make_reference(const std::string& path, bool with_others) {
  std::mt19937_64 rng(3);
  auto random_bytes = [&](std::size_t n) {
    std::string d(n, '\0');
    for (char& c : d) c = char(rng());
    return d;
  };
  std::vector<raw_tensor> ts = {{"a", "F32", {3, 4}, random_bytes(48)},
                                {"b.w", "BF16", {5}, random_bytes(10)},
                                {"c", "F16", {2, 3}, random_bytes(12)},
                                {"z", "F32", {0}, ""}};
  if (with_others) {
    ts.insert(ts.begin() + 1, {"ids", "I64", {4}, random_bytes(32)});
    ts.insert(ts.begin() + 3, {"mask", "BOOL", {3}, random_bytes(3)});
  }
  reference_file r;
  r.bytes = safetensors_bytes(ts, {{"format", "pt"}});
  ck::write_small_file(path, r.bytes);
  ck::safetensors_file f(path);
  r.data_start = f.header().data_start;
  for (const auto& t : ts)
    if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") r.floats.push_back({t.name, f.find(t.name)->type, t.shape, t.data});
  return r;
}

outcome check_mutant(const std::string& path, const reference_file& ref) {
  bool redeclared = false;
  std::optional<ck::safetensors_file> f;
  try {
    f.emplace(path);
  } catch (const zshard::error& e) {
    if (std::string(e.what()).find(path) == std::string::npos) return outcome::wrong;  // names the file
    return outcome::refused;
  }
  for (const auto& t : ref.floats) {
    const ck::tensor_entry* e = f->find(t.name);
    if (!e || !ck::param_dtype_of(e->type) || e->shape != t.shape) return outcome::refused;  // the model's check
    if (ck::size_of(e->type) != ck::size_of(t.type)) return outcome::wrong;  // the offsets' check failed
    std::string got(t.data.size(), '\0');
    const std::uint64_t half = e->numel() / 2;
    f->read(*e, 0, half, got.data());  // in two ranges, as ranks read their shards
    f->read(*e, half, e->numel() - half, got.data() + half * ck::size_of(e->type));
    if (got != t.data) return outcome::wrong;  // shifted or foreign bytes
    if (e->type != t.type) redeclared = true;
  }
  return redeclared ? outcome::redeclared : outcome::original;
}

// Mutations of the header (the 8-byte length, the JSON, its padding), of the file's length, and
// a byte lost or gained; the data bytes themselves are the format's to trust (no checksum).
void mutate_and_check(const temp_dir& dir, bool with_others, int count, std::uint64_t seed) {
  const reference_file ref = make_reference(dir / "ref.safetensors", with_others);
  const std::string p = dir / "mutant.safetensors";
  REQUIRE(check_mutant(dir / "ref.safetensors", ref) == outcome::original);
  std::mt19937_64 rng(seed);
  const std::string interesting = "0123456789\"{}[],: \t\nFIUB_.-e";
  auto header_pos = [&](std::uint64_t from) { return from + rng() % (ref.data_start - from); };
  auto set_length = [](std::string& s, std::uint64_t n) { s.replace(0, 8, le64(n)); };
  const std::uint64_t json_len = ref.data_start - 8;
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < count; ++i) {
    std::string m = ref.bytes;
    const int kind = int(rng() % 8);
    switch (kind) {
      case 0: m[header_pos(0)] = char(rng()); break;                                  // any byte of the header
      case 1: m[header_pos(8)] = interesting[rng() % interesting.size()]; break;      // JSON syntax and digits
      case 2: m[header_pos(0)] ^= char(1u << (rng() % 8)); break;                     // one bit
      case 3: set_length(m, json_len + 1 + rng() % 8 - (rng() % 2 ? 9 : 0)); break;  // length off by -8..8
      case 4: m.erase(header_pos(8), 1); break;                                       // a byte lost
      case 5: {                                                                       // ... and the length fixed
        m.erase(header_pos(8), 1);
        set_length(m, json_len - 1);
        break;
      }
      case 6: {  // a byte gained
        m.insert(header_pos(8), 1, interesting[rng() % interesting.size()]);
        if (rng() % 2) set_length(m, json_len + 1);
        break;
      }
      default:
        if (rng() % 2)
          m.resize(rng() % m.size());  // truncated anywhere
        else
          m.append(1 + rng() % 9, char(rng()));  // trailing garbage
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << m;  // no fsync: 2000 files
    const outcome o = check_mutant(p, ref);
    ++counts[int(o)];
    const bool length_fixed = kind == 5 || (kind == 6 && m.size() == ref.bytes.size() + 1 &&
                                            m.compare(0, 8, le64(json_len + 1)) == 0);
    if (o == outcome::wrong || (o == outcome::redeclared && !length_fixed)) {
      INFO("mutation " << i << " of kind " << kind);
      FAIL_CHECK("a mutated file read other bytes than the original's, or its error does not name it");
    }
  }
  MESSAGE("refused " << counts[0] << ", read the original values " << counts[1]
                     << ", the original bytes as another float dtype of a rewritten valid header " << counts[2]
                     << ", other values " << counts[3]);
  CHECK(counts[3] == 0);
  CHECK(counts[0] > count / 2);    // the mutations reach the checks ...
  CHECK(counts[1] > count / 100);  // ... and harmless ones (padding, metadata) still read
}

}  // namespace

TEST_CASE("safetensors: 4000 random mutations of valid files either read the original values or are refused") {
  temp_dir dir(memory_temp_base());  // 4000 files written and read back
  SUBCASE("float tensors only") { mutate_and_check(dir, false, 2000, 25); }
  SUBCASE("with integer and boolean tensors") { mutate_and_check(dir, true, 2000, 26); }
}
