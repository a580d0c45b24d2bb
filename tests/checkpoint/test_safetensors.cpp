// CRC32C against the standard check value and the two implementations against each other;
// safetensors headers: round trip through the writer and the reader, and every way a header
// can be wrong is refused with a message naming the file.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "raw_safetensors.hpp"
#include "test_dir.hpp"
#include "zshard/checkpoint/crc32c.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/checkpoint/safetensors_writer.hpp"

namespace ck = zshard::checkpoint;
using ckpt_test::open_error;
using ckpt_test::raw_file;
using ckpt_test::temp_dir;

namespace {

// Bitwise reference: one bit at a time, the definition.
std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

void write_raw(const std::string& path, const std::string& bytes) { ck::write_small_file(path, bytes); }

}  // namespace

TEST_CASE("crc32c: check value, table and hardware agree with the bitwise definition on random data") {
  const std::string check = "123456789";
  CHECK(ck::crc32c_of(check.data(), check.size(), ck::crc32c_impl::table) == 0xE3069283u);
  CHECK(ck::crc32c_of(check.data(), check.size()) == 0xE3069283u);
  CHECK(ck::crc32c_of(nullptr, 0) == 0u);
  std::mt19937_64 rng(7);
  // around the hardware path's rounds of three 8 KiB chains (crc32c.hpp) too
  for (std::size_t n : {1u, 7u, 8u, 9u, 63u, 4096u, 3u * 8192u - 1u, 3u * 8192u, 3u * 8192u + 5u, 100003u, 1048579u}) {
    std::vector<unsigned char> v(n);
    for (auto& b : v) b = static_cast<unsigned char>(rng());
    const std::uint32_t want = crc32c_bitwise(v.data(), n);
    CHECK(ck::crc32c_of(v.data(), n, ck::crc32c_impl::table) == want);
    CHECK(ck::crc32c_of(v.data(), n, ck::crc32c_impl::automatic) == want);
    ck::crc32c pieces;  // in uneven pieces
    for (std::size_t at = 0; at < n; at += 13) pieces.update(v.data() + at, std::min<std::size_t>(13, n - at));
    CHECK(pieces.value() == want);
    ck::crc32c rounds;  // in pieces of several rounds and a tail
    for (std::size_t at = 0; at < n; at += 30001) rounds.update(v.data() + at, std::min<std::size_t>(30001, n - at));
    CHECK(rounds.value() == want);
    std::vector<unsigned char> copy(n + 1, 0xAB);  // hashed from the loads that copy (load's verified reads)
    ck::crc32c copied;
    copied.update_copy(copy.data(), v.data(), n);
    CHECK(copied.value() == want);
    CHECK(std::memcmp(copy.data(), v.data(), n) == 0);
    CHECK(copy[n] == 0xAB);
    ck::crc32c copied_table(ck::crc32c_impl::table);
    copied_table.update_copy(copy.data(), v.data(), n);
    CHECK(copied_table.value() == want);
  }
}

TEST_CASE("safetensors: writer and reader round trip, ranges read by pread") {
  temp_dir dir;
  const std::string path = dir / "a.safetensors";
  std::vector<float> a(37);
  std::vector<std::uint16_t> b(12);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f - 3.f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = zshard::to_bf16(float(i) + 0.25f).bits;
  {
    ck::safetensors_writer w(path, {{"a", ck::file_dtype::f32, {37}}, {"b.w", ck::file_dtype::bf16, {3, 4}}},
                             {{"k", "v"}});
    w.write(a.data(), 10 * 4);  // in pieces that cross tensor boundaries
    std::vector<char> rest(27 * 4 + 24);
    std::memcpy(rest.data(), a.data() + 10, 27 * 4);
    std::memcpy(rest.data() + 27 * 4, b.data(), 24);
    w.write(rest.data(), rest.size());
    const auto wf = w.finish();
    CHECK(wf.bytes == std::filesystem::file_size(path));
    const std::string all = ck::read_small_file(path);
    CHECK(wf.crc == ck::crc32c_of(all.data(), all.size()));
  }
  ck::safetensors_file f(path);
  CHECK(f.header().metadata.at("k") == "v");
  CHECK((f.header().data_start % 8) == 0);
  const auto* ta = f.find("a");
  const auto* tb = f.find("b.w");
  REQUIRE(ta);
  REQUIRE(tb);
  CHECK(tb->shape == std::vector<std::int64_t>{3, 4});
  std::vector<float> got(5);
  f.read(*ta, 30, 5, got.data());
  for (int i = 0; i < 5; ++i) CHECK(got[std::size_t(i)] == a[std::size_t(30 + i)]);
  std::vector<std::uint16_t> gb(12);
  f.read(*tb, 0, 12, gb.data());
  CHECK(gb == b);
  CHECK_THROWS_AS(f.read(*ta, 35, 5, got.data()), zshard::error);
}

TEST_CASE("safetensors: a writer refuses too many or too few bytes") {
  temp_dir dir;
  ck::safetensors_writer w(dir / "x.safetensors", {{"a", ck::file_dtype::f32, {2}}});
  float v[3] = {1, 2, 3};
  CHECK_THROWS_AS(w.write(v, 12), zshard::error);
  ck::safetensors_writer w2(dir / "y.safetensors", {{"a", ck::file_dtype::f32, {2}}});
  w2.write(v, 4);
  CHECK_THROWS_AS(w2.finish(), zshard::error);
}

TEST_CASE("safetensors: every malformed header is refused, naming the file and the problem") {
  temp_dir dir;
  const std::string p = dir / "bad.safetensors";
  const std::string data(16, '\x01');
  struct bad_case {
    std::string bytes, expect;
  };
  const std::vector<bad_case> cases = {
      {"abc", "fewer than the 8-byte"},
      {raw_file("{}", "").substr(0, 8) + std::string("\xff"), "exceeds the file"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds the file"},
      {raw_file("{not json", data), "not valid JSON"},
      {raw_file("[1,2]", data), "does not start with '{'"},
      {raw_file("{} []", data), "not valid JSON"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", data), "lacks dtype, shape or data_offsets"},
      {raw_file(R"({"a":{"dtype":"F65","shape":[2],"data_offsets":[0,16]}})", data), "dtype 'F65', which the safetensors format does not define"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "bad dimension"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", data), "holds 12 bytes but its shape [2] and dtype F32 need 8"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data), "truncated"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "begin > end"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           data),
       "overlap"},
      {raw_file(R"({"__metadata__":{"x":1}})", data), "not a string"},
  };
  for (const auto& c : cases) {
    write_raw(p, c.bytes);
    const std::string e = open_error(p);
    INFO(c.expect);
    CHECK(e.find(c.expect) != std::string::npos);
    CHECK(e.find(p) != std::string::npos);
  }
  // and a good one passes
  write_raw(
      p,
      raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})",
          data));
  CHECK(open_error(p).empty());
}

TEST_CASE("safetensors index: tensors found across files; an index that disagrees with its files is refused") {
  temp_dir dir;
  float v[4] = {1, 2, 3, 4};
  {
    ck::safetensors_writer w(dir / "m-1.safetensors", {{"x", ck::file_dtype::f32, {2}}});
    w.write(v, 8);
    w.finish();
    ck::safetensors_writer w2(dir / "m-2.safetensors", {{"y", ck::file_dtype::f32, {2}}});
    w2.write(v + 2, 8);
    w2.finish();
  }
  ck::write_small_file(dir / "m.index.json",
                       R"({"metadata":{},"weight_map":{"x":"m-1.safetensors","y":"m-2.safetensors"}})");
  ck::safetensors_source src(dir / "m.index.json");
  CHECK(src.file_count() == 2);
  auto y = src.find("y");
  REQUIRE(y.tensor);
  float got[2];
  y.file->read(*y.tensor, 0, 2, got);
  CHECK(got[1] == 4.f);
  CHECK(!src.find("z").tensor);
  ck::write_small_file(dir / "bad.index.json", R"({"weight_map":{"x":"m-2.safetensors"}})");
  CHECK_THROWS_WITH_AS(ck::safetensors_source(dir / "bad.index.json"), doctest::Contains("does not hold it"),
                       zshard::error);
  CHECK_THROWS_WITH_AS(ck::safetensors_source(dir / "missing.safetensors"), doctest::Contains("missing.safetensors"),
                       zshard::error);
}
