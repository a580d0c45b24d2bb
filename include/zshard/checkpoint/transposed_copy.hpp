#pragma once
// Parameters whose files hold their transpose (param_options::file_transposed: a linear weight
// the model keeps as (in, out) for x @ W appears in safetensors files as torch's (out, in)).
// The engine holds such a (rows, cols) parameter row-major, and a rank a flat range of it; in
// the file, element (i, j) sits at j * rows + i. A range is cut into blocks [i0, i1) x [j0, j1)
// of at most a chunk's elements, each made of row runs on the engine's side and of column runs
// (contiguous in the file) on the file's side, transposed in host memory between the two: a
// block of whole rows costs one file access per column, a piece of a row one per element.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

struct matrix_block {
  std::uint64_t i0 = 0, i1 = 0, j0 = 0, j1 = 0;  // rows [i0, i1), columns [j0, j1)
  std::uint64_t rows() const noexcept { return i1 - i0; }
  std::uint64_t cols() const noexcept { return j1 - j0; }
};

// Calls fn(block) for blocks that cover the flat row-major range [b, e) of a matrix with `cols`
// columns exactly once, in order, each of at most max_numel (>= 1) elements: whole rows where
// they fit, else pieces of one row.
template <class F>
void for_each_block(std::uint64_t cols, std::uint64_t b, std::uint64_t e, std::uint64_t max_numel, F&& fn) {
  ZSHARD_REQUIRE(cols > 0 && max_numel > 0, error_kind::invariant, "for_each_block: empty matrix or chunk");
  for (std::uint64_t g = b; g < e;) {
    const std::uint64_t i = g / cols, j = g % cols;
    if (j == 0 && e - g >= cols && cols <= max_numel) {
      const std::uint64_t h = std::min((e - g) / cols, max_numel / cols);
      fn(matrix_block{i, i + h, 0, cols});
      g += h * cols;
    } else {
      const std::uint64_t j1 = std::min({cols, j + (e - g), j + max_numel});
      fn(matrix_block{i, i + 1, j, j1});
      g += j1 - j;
    }
  }
}

// dst[c][r] = src[r][c] for a rows x cols matrix of `elem`-byte elements.
inline void transpose_bytes(const char* src, char* dst, std::uint64_t rows, std::uint64_t cols, std::size_t elem) {
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t c = 0; c < cols; ++c) std::memcpy(dst + (c * rows + r) * elem, src + (r * cols + c) * elem, elem);
}

}  // namespace zshard::checkpoint
