#pragma once
// The engine's per-parameter tables (param_store's slots, the residency's pins, the Offloaders'
// optimizer bookkeeping) in memory the kernel may back with 2 MiB pages.
//
// Why: a model of 100,000 parameters keeps about 15 MB in each of these tables, and every scope
// touches a few of their entries. On 4 KiB pages that is one TLB entry per 4 KiB of table:
// beyond the few thousand the TLB holds, each scope's lookups walk the page tables (in a virtual
// machine, a walk of two sets of them). Measured with bench/engine_overhead's model (2-core
// Intel Xeon VM, modules of two parameters; bench/NOTES_issue27.md): at 50,000 modules the forward scope
// 78 -> 70 ns and begin+end of backward 26 -> 23 ns per module; at 5,000 modules (tables of
// 0.2-1.6 MB) the forward scope 80-91 -> 72-77 ns. The model's own allocations on huge pages as
// well (glibc.malloc.hugetlb=1) gained little more.
//
// Linux only: madvise(MADV_HUGEPAGE) asks for huge pages where transparent huge pages are set to
// "madvise" (the Debian and Ubuntu default) and is a no-op where they are "always" or "never";
// elsewhere the tables are ordinary allocations. The costs: a table is rounded up to a multiple of
// 2 MiB (at most 2 MiB of resident memory more per table), and the kernel may compact memory to
// find a huge page when the table is first written (once, at engine construction: 0-170 ms
// measured for 100,000 parameters on that VM).
#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace zshard {

template <class T>
class huge_page_allocator {
 public:
  using value_type = T;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;
  // Tables from this size on: at 256 KiB (1,600 parameter slots) a few tables already outgrow the
  // TLB's reach; a smaller one costs more in rounding than it saves.
  static constexpr std::size_t smallest_huge_table = std::size_t{256} << 10;

  huge_page_allocator() noexcept = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > max_size()) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < smallest_huge_table) return static_cast<T*>(::operator new (bytes, std::align_val_t{alignof(T)}));
    const std::size_t rounded = round_up(bytes);
    void* p = ::operator new (rounded, std::align_val_t{huge_page});
#if defined(__linux__)
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: a refusal leaves ordinary pages
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < smallest_huge_table)
      ::operator delete (p, bytes, std::align_val_t{alignof(T)});
    else
      ::operator delete (p, round_up(bytes), std::align_val_t{huge_page});
  }
  // Room for the rounding up, within the largest object size (PTRDIFF_MAX).
  static constexpr std::size_t max_size() noexcept {
    return (static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) - huge_page) / sizeof(T);
  }

  template <class U>
  bool operator==(const huge_page_allocator<U>&) const noexcept {
    return true;
  }

 private:
  static constexpr std::size_t round_up(std::size_t bytes) noexcept {
    return (bytes + huge_page - 1) / huge_page * huge_page;
  }
};

// A table with one entry per parameter (indexed by param_id), or per module.
template <class T>
using param_table = std::vector<T, huge_page_allocator<T>>;

}  // namespace zshard
