// The engine's per-parameter tables (core/param_table.hpp): a table of 256 KiB or more starts on
// a 2 MiB boundary and carries the huge-page advice; every table keeps its contents through
// growth and shrinking across that size, and frees what it allocated (ASan checks the sizes).
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "zshard/core/param_table.hpp"

using namespace zshard;

namespace {

constexpr std::size_t huge = huge_page_allocator<int>::huge_page;
constexpr std::size_t smallest = huge_page_allocator<int>::smallest_huge_table;

struct entry {  // the size of a parameter slot's neighbourhood: not a power of two
  std::uint64_t id = 0;
  std::uint64_t fill[9] = {};
};

bool on_boundary(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % huge == 0; }

// "THPeligible" of the mapping that holds `p` in /proc/self/smaps: 1 when the kernel may back it
// with huge pages (the advice was taken), -1 when the kernel does not say.
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

// Whether transparent huge pages honour madvise here ("always" or "madvise" selected).
bool thp_madvise_honoured() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
}

}  // namespace

TEST_CASE("param_table: contents survive growth and shrinking across the huge-page size") {
  std::mt19937_64 rng(20261205);
  param_table<entry> t;
  std::vector<std::uint64_t> expected;
  const std::size_t big = huge / sizeof(entry) * 3 + 17;  // over 6 MiB, not a whole number of pages
  std::size_t misaligned = 0, reallocations = 0;
  for (std::size_t i = 0; i < big; ++i) {
    const std::uint64_t v = rng();
    const entry* before = t.data();
    t.push_back(entry{v, {v + 1}});
    expected.push_back(v);
    reallocations += t.data() != before;
    misaligned += t.capacity() * sizeof(entry) >= smallest && !on_boundary(t.data());
  }
  CHECK(misaligned == 0);
  CHECK(reallocations > 3);  // it crossed 256 KiB and 2 MiB by growing
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < big; ++i) wrong += t[i].id != expected[i] || t[i].fill[0] != expected[i] + 1;
  CHECK(wrong == 0);
  t.resize(100);
  t.shrink_to_fit();  // back under 256 KiB: an ordinary allocation again
  CHECK(t.capacity() * sizeof(entry) < smallest);
  for (std::size_t i = 0; i < 100; ++i) CHECK(t[i].id == expected[i]);
  param_table<entry> copy(t);
  CHECK(copy.size() == 100);
  CHECK(copy[99].id == expected[99]);
}

TEST_CASE("param_table: at the smallest huge table, one element short of it, and a whole huge page") {
  using words = param_table<std::uint64_t>;
  const std::size_t w = sizeof(std::uint64_t);
  words at(smallest / w, 7), under(smallest / w - 1, 9), page(huge / w, 5), over(huge / w + 1, 3);
  CHECK(on_boundary(at.data()));
  CHECK(on_boundary(page.data()));
  CHECK(on_boundary(over.data()));
  CHECK(at.back() == 7);
  CHECK(under.back() == 9);
  CHECK(page.back() == 5);
  CHECK(over.back() == 3);
  CHECK(words().empty());
}

TEST_CASE("param_table: a large table carries the huge-page advice") {
  param_table<entry> t(2 * huge / sizeof(entry) + 1);
  REQUIRE(on_boundary(t.data()));
  if (!thp_madvise_honoured()) {
    MESSAGE("transparent huge pages are off on this machine: only the alignment is checked");
    return;
  }
  const int eligible = thp_eligible(t.data());
  if (eligible < 0) {
    MESSAGE("this kernel's smaps has no THPeligible field: only the alignment is checked");
    return;
  }
  CHECK(eligible == 1);
}
