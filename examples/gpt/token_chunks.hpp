#pragma once
// A batch's index arrays for the token embedding's gradient (ops_contract.hpp, token_chunks),
// built on the host: the rows grouped by token with a stable counting sort (O(N + vocab), no
// comparison sort in the step), each token's rows cut into chunks of at most
// embed_rows_per_chunk, and the partial-sum rows of the tokens with several chunks.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops_contract.hpp"

namespace gpt::ops {

struct token_chunk_plan {
  std::vector<std::int32_t> by_row, chunk_begin, chunk_token, chunk_slot, multi_token, multi_slot;

  // tokens: N ids in [0, vocab) (checked by the caller).
  void build(const std::vector<std::int32_t>& tokens, int vocab) {
    const std::size_t n = tokens.size();
    count_.assign(std::size_t(vocab) + 1, 0);
    for (std::int32_t t : tokens) ++count_[std::size_t(t) + 1];
    for (std::size_t v = 1; v < count_.size(); ++v) count_[v] += count_[v - 1];  // count_[t]: first position of t
    by_row.resize(n);
    for (std::size_t r = 0; r < n; ++r) by_row[std::size_t(count_[std::size_t(tokens[r])]++)] = std::int32_t(r);
    chunk_begin.clear();
    chunk_token.clear();
    chunk_slot.clear();
    multi_token.clear();
    multi_slot.assign(1, 0);
    for (std::size_t i = 0; i < n;) {  // one token's rows: [i, end)
      const std::int32_t tok = tokens[std::size_t(by_row[i])];
      std::size_t end = i;
      while (end < n && tokens[std::size_t(by_row[end])] == tok) ++end;
      const bool several = end - i > std::size_t(embed_rows_per_chunk);
      for (std::size_t at = i; at < end; at += std::size_t(embed_rows_per_chunk)) {
        chunk_begin.push_back(std::int32_t(at));
        chunk_token.push_back(tok);
        chunk_slot.push_back(several ? multi_slot.back() + std::int32_t((at - i) / embed_rows_per_chunk) : -1);
      }
      if (several) {
        multi_token.push_back(tok);
        multi_slot.push_back(multi_slot.back() + std::int32_t((end - i + embed_rows_per_chunk - 1) / embed_rows_per_chunk));
      }
      i = end;
    }
    chunk_begin.push_back(std::int32_t(n));
  }

 private:
  std::vector<std::int32_t> count_;
};

}  // namespace gpt::ops
