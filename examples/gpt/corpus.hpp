#pragma once
// Training data for the GPT example: a synthetic language generated from a seed (learnable
// structure, so a tiny model's loss falls visibly within a few dozen steps) or a text file
// read as bytes (vocab 256), and a sampler whose batches are a pure function of
// (seed, batch index, row): every rank and the single-process reference fetch the same global
// batch, or just their own rows of it, without talking to each other.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hash.hpp"

namespace gpt {

// [batch_size, seq_len] row-major; targets[r, t] is the token after tokens[r, t].
struct batch {
  int batch_size = 0;
  int seq_len = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;

  // Rows [first, first + count): a rank's micro-batch of the global batch.
  batch slice(int first, int count) const {
    if (first < 0 || count < 0 || first + count > batch_size)
      throw std::out_of_range("batch::slice: rows [" + std::to_string(first) + ", " +
                              std::to_string(first + count) + ") outside a batch of " +
                              std::to_string(batch_size));
    batch out{count, seq_len, {}, {}};
    const auto b = static_cast<std::ptrdiff_t>(first) * seq_len;
    const auto e = b + static_cast<std::ptrdiff_t>(count) * seq_len;
    out.tokens.assign(tokens.begin() + b, tokens.begin() + e);
    out.targets.assign(targets.begin() + b, targets.begin() + e);
    return out;
  }
};

// The synthetic language's token layout. Sentences end with '.', and come in three kinds:
//   plain:  [adj] noun verb noun [and noun] .  with number agreement (singular nouns take
//           singular verbs), each noun preferring two verbs, each verb three objects, each
//           noun two adjectives: strong bigram/trigram structure a tiny model learns fast;
//   count:  count d d+1 d+2 ... .  digits mod 10, deterministic after the first;
//   repeat: repeat <the previous plain sentence again>: copying, which needs attention.
class synthetic_language {
 public:
  static constexpr int period = 0, count_word = 1, repeat_word = 2, and_word = 3, digit0 = 4;
  static constexpr int min_vocab = 32;

  explicit synthetic_language(int vocab) : vocab_(vocab) {
    if (vocab < min_vocab || vocab > 65536)
      throw std::invalid_argument("synthetic_language: vocab must be in [32, 65536], got " +
                                  std::to_string(vocab));
    const int rest = vocab - (digit0 + 10);
    nouns_ = rest / 4;
    verbs_ = (rest - 2 * nouns_) / 3;
    adjs_ = rest - 2 * nouns_ - 2 * verbs_;
  }

  int vocab() const noexcept { return vocab_; }
  int noun(int plural, int i) const noexcept { return digit0 + 10 + plural * nouns_ + i; }
  int verb(int plural, int i) const noexcept {
    return digit0 + 10 + 2 * nouns_ + plural * verbs_ + i;
  }
  int adjective(int i) const noexcept { return digit0 + 10 + 2 * nouns_ + 2 * verbs_ + i; }

  // A readable name per token, for printing samples.
  std::string token_name(int t) const {
    if (t == period) return ".";
    if (t == count_word) return "count";
    if (t == repeat_word) return "repeat";
    if (t == and_word) return "and";
    if (t < digit0 + 10) return std::to_string(t - digit0);
    int i = t - digit0 - 10;
    if (i < 2 * nouns_) return (i < nouns_ ? "n" : "ns") + std::to_string(i % nouns_);
    i -= 2 * nouns_;
    if (i < 2 * verbs_) return (i < verbs_ ? "vs" : "v") + std::to_string(i % verbs_);
    return "a" + std::to_string(i - 2 * verbs_);
  }

  std::vector<int32_t> generate(uint64_t seed, std::size_t n_tokens) const {
    rng r{hash_combine(seed, 0x6c616e67ULL)};
    std::vector<int32_t> out;
    out.reserve(n_tokens + 16);
    std::vector<int32_t> last;  // previous plain sentence, for "repeat"
    while (out.size() < n_tokens) {
      const double kind = r.uniform();
      if (kind < 0.25) {
        out.push_back(count_word);
        const int start = r.below(10), len = 3 + r.below(4);
        for (int i = 0; i < len; ++i) out.push_back(digit0 + (start + i) % 10);
        out.push_back(period);
      } else if (kind < 0.45 && !last.empty()) {
        out.push_back(repeat_word);
        out.insert(out.end(), last.begin(), last.end());
      } else {
        last.clear();
        plain_sentence(r, last);
        out.insert(out.end(), last.begin(), last.end());
      }
    }
    out.resize(n_tokens);
    return out;
  }

 private:
  void plain_sentence(rng& r, std::vector<int32_t>& s) const {
    // Subjects follow a skewed (Zipf-like) law, as words do: a few nouns are common.
    const int plural = r.below(2), n = static_cast<int>(nouns_ * r.uniform() * r.uniform());
    if (r.uniform() < 0.4) s.push_back(adjective((n * 7 + r.below(2)) % adjs_));
    s.push_back(noun(plural, n));
    const int v = (n * 3 + r.below(2)) % verbs_;
    s.push_back(verb(plural, v));
    const int obj_plural = r.below(2), obj = (v * 5 + r.below(3)) % nouns_;
    s.push_back(noun(obj_plural, obj));
    if (r.uniform() < 0.2) {
      s.push_back(and_word);
      s.push_back(noun(obj_plural, (obj + 1) % nouns_));
    }
    s.push_back(period);
  }

  int vocab_;
  int nouns_ = 0, verbs_ = 0, adjs_ = 0;
};

class corpus {
 public:
  // n_tokens of the synthetic language with `vocab` tokens; seed fixes text and sampling.
  static corpus synthetic(uint64_t seed, int vocab = 64,
                          std::size_t n_tokens = std::size_t{1} << 18) {
    return corpus(synthetic_language(vocab).generate(seed, n_tokens), vocab, seed);
  }

  // A text file as bytes (vocab 256). min_seq_len: the longest window the trainer will ask
  // for, so a too-short file fails here with its name rather than at the first batch.
  static corpus from_file(const std::string& path, int min_seq_len, uint64_t seed = 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("corpus: cannot open text file '" + path + "'");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t need = static_cast<std::size_t>(min_seq_len < 1 ? 1 : min_seq_len) + 1;
    if (bytes.size() < need)
      throw std::runtime_error("corpus: text file '" + path + "' has " +
                               std::to_string(bytes.size()) + " bytes; need at least " +
                               std::to_string(need) + " (seq_len + 1)");
    std::vector<int32_t> tokens(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
    return corpus(std::move(tokens), 256, seed);
  }

  int vocab() const noexcept { return vocab_; }
  std::size_t size() const noexcept { return tokens_.size(); }
  std::span<const int32_t> tokens() const noexcept { return tokens_; }

  // Global batch `index`: batch_size windows of seq_len tokens (and their targets).
  batch get_batch(uint64_t index, int batch_size, int seq_len) const {
    return get_rows(index, 0, batch_size, seq_len);
  }

  // Rows [first, first + count) of global batch `index`, without building the others:
  // equal to get_batch(index, B, seq_len).slice(first, count) for any B >= first + count.
  batch get_rows(uint64_t index, int first, int count, int seq_len) const {
    if (first < 0 || count < 0 || seq_len < 1)
      throw std::invalid_argument("corpus::get_rows: need first >= 0, count >= 0, seq_len >= 1");
    batch out{count, seq_len, {}, {}};
    const auto n = static_cast<std::size_t>(count) * static_cast<std::size_t>(seq_len);
    out.tokens.resize(n);
    out.targets.resize(n);
    for (int r = 0; r < count; ++r) {
      const std::size_t s = window_start(index, first + r, seq_len);
      const auto at = static_cast<std::size_t>(r) * static_cast<std::size_t>(seq_len);
      for (int t = 0; t < seq_len; ++t) {
        out.tokens[at + static_cast<std::size_t>(t)] = tokens_[s + static_cast<std::size_t>(t)];
        out.targets[at + static_cast<std::size_t>(t)] =
            tokens_[s + static_cast<std::size_t>(t) + 1];
      }
    }
    return out;
  }

  // Where row `row` of batch `index` starts; targets need one token past the window.
  std::size_t window_start(uint64_t index, int row, int seq_len) const {
    const auto len = static_cast<std::size_t>(seq_len);
    if (tokens_.size() < len + 1)
      throw std::invalid_argument("corpus: " + std::to_string(tokens_.size()) +
                                  " tokens are too few for seq_len " + std::to_string(seq_len) +
                                  " (need seq_len + 1)");
    const uint64_t h =
        hash_combine(hash_combine(seed_ ^ 0x73616d706c65ULL, index), static_cast<uint64_t>(row));
    return static_cast<std::size_t>(h % (tokens_.size() - len));
  }

 private:
  corpus(std::vector<int32_t> tokens, int vocab, uint64_t seed)
      : tokens_(std::move(tokens)), vocab_(vocab), seed_(seed) {}

  std::vector<int32_t> tokens_;
  int vocab_;
  uint64_t seed_;
};

}  // namespace gpt
