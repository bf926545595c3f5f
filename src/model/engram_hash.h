// Engram n-gram hashing (spec §4.3; reference inference/engram.py: compute_hash_multipliers and
// NgramHashState.forward).
//
// Every position i of a sequence is hashed, per Engram layer, from the compressed ids of the
// max_ngram_size tokens ending at i:
//   u_k   = compressed id at position i-k (k = 0 .. N-1), or the pad id (token_map[engram_pad_id])
//           when i-k < 0 or when any position i-j, j <= k, is DEAD (an image token);
//   r_1   = (u_0 * m_0) XOR (u_1 * m_1),  r_n = r_{n-1} XOR (u_n * m_n)      (int64, wrapping)
//   row   = offset[c] + (r_{n} mod prime[c])   for column c = (n - 1) * n_heads + head, n = 1..N-1
// The multipliers m are numpy's `default_rng(10007 * layer_id).integers(0, bound, size=N,
// dtype=int64) * 2 + 1`, bound = max(1, (INT64_MAX // compressed_vocab_size) // 2), reproduced bit
// for bit by the small numpy port below (SeedSequence -> PCG64 -> bounded integers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "spec/config.h"
#include "spec/engram_layout.h"

namespace cedar::model {

// ---- numpy.random, the parts default_rng(int).integers(..., dtype=int64) uses --------------------
namespace numpy_random {

// numpy.random.SeedSequence(entropy).generate_state(n_words, np.uint32) for a non-negative integer
// entropy and no spawn key (pool size 4, numpy's hashmix/mix constants).
std::vector<uint32_t> seed_sequence_state_u32(uint64_t entropy, size_t n_words);
// The same as uint64 words (pairs of uint32 words, the first one low), as generate_state(n, np.uint64).
std::vector<uint64_t> seed_sequence_state_u64(uint64_t entropy, size_t n_words);

// numpy.random.PCG64: 128-bit LCG with the XSL-RR 64-bit output, seeded as numpy seeds it.
class Pcg64 {
 public:
  // PCG64(seed) for a non-negative integer seed, i.e. what default_rng(seed) builds.
  explicit Pcg64(uint64_t seed);
  // bit_generator.random_raw(): advance, then output from the new state.
  uint64_t next_u64();
  // numpy's next_uint32: the low half of a fresh 64-bit output, then its high half (buffered).
  uint32_t next_u32();
  // The 128-bit state and increment as numpy reports them in bit_generator.state (hi, lo words).
  uint64_t state_hi() const { return static_cast<uint64_t>(state_ >> 64); }
  uint64_t state_lo() const { return static_cast<uint64_t>(state_); }
  uint64_t inc_hi() const { return static_cast<uint64_t>(inc_ >> 64); }
  uint64_t inc_lo() const { return static_cast<uint64_t>(inc_); }

 private:
  void step();
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_u32_ = false;
  uint32_t buffered_u32_ = 0;
};

// Generator.integers(low, high, size=count, dtype=np.int64) with endpoint=False (low < high):
// numpy's random_bounded_uint64_fill with use_masked=False (Lemire's nearly-divisionless method on
// the 32-bit generator when high - low - 1 fits in 32 bits, on the 64-bit one otherwise).
std::vector<int64_t> integers_int64(Pcg64& gen, int64_t low, int64_t high, size_t count);

}  // namespace numpy_random

// [layer][k], k = 0 .. max_ngram_size-1: the odd hash multipliers of engram.py
// compute_hash_multipliers. Layer ids must be >= 0 and compressed_vocab_size > 0 (validate_config
// guarantees both); max_ngram_size >= 1.
std::vector<std::vector<int64_t>> engram_multipliers(const std::vector<int>& layer_ids, int max_ngram_size,
                                                     int64_t compressed_vocab_size);

// Marks a position whose token takes no part in any n-gram (image spans): it and everything before
// it are invisible to later look-backs, exactly like the start of the sequence.
inline constexpr int32_t kEngramDead = -1;

// Per-sequence history the caller owns (one per sequence, next to its KV cache): the compressed id of
// every position hashed so far, kEngramDead for image tokens. Keeping every position (4 bytes each)
// instead of only the last max_ngram_size-1 lets a sequence rewind (rejected draft tokens, a shorter
// prefix reused) by starting the next hash call at an earlier position, as the reference's cache does.
struct EngramHistory {
  std::vector<int32_t> compressed;  // [n_positions]

  int64_t size() const { return static_cast<int64_t>(compressed.size()); }
  void clear() { compressed.clear(); }
};

// Token -> Engram row ids for every Engram layer. Immutable after create(); one instance serves all
// sequences (each brings its own EngramHistory).
class NgramHasher {
 public:
  // token_map: compressed class id of every raw token id (tokenizer's build_engram_token_map), dense
  // classes 0 .. engram_compressed_vocab_size-1. Errors name the offending field or token id.
  static Result<NgramHasher> create(const ModelConfig& config, const EngramLayout& layout,
                                    std::vector<int32_t> token_map);

  int n_layers() const { return n_layers_; }
  // Raw token ids the map covers (the tokenizer's size); larger ids cannot be hashed.
  int64_t token_map_size() const { return static_cast<int64_t>(token_map_.size()); }
  int n_columns() const { return n_columns_; }
  int max_ngram_size() const { return max_ngram_size_; }
  int32_t pad_id() const { return pad_id_; }
  // [layer][k] as engram_multipliers().
  const std::vector<std::vector<int64_t>>& multipliers() const { return multipliers_; }

  // Hashes the tokens at positions start_pos .. start_pos+n-1 (n = token_ids.size()) of a sequence.
  // `history` must hold at least start_pos positions; it is cut to start_pos and the new tokens'
  // compressed ids are appended (so calls chain: prefill, then one call per decode step).
  // takes_part: empty (all text), or one flag per token, 0 for image tokens (stored DEAD, hashed
  // as the pad context). row_ids: [n, n_layers, n_columns] (global rows of each layer's table).
  // On error nothing is changed.
  Status hash(EngramHistory& history, int64_t start_pos, std::span<const int32_t> token_ids,
              std::span<const uint8_t> takes_part, std::span<int64_t> row_ids) const;

 private:
  NgramHasher() = default;

  int n_layers_ = 0, n_columns_ = 0, max_ngram_size_ = 0, n_heads_ = 0;
  int32_t pad_id_ = 0;
  std::vector<int32_t> token_map_;                    // [raw vocab]
  std::vector<std::vector<int64_t>> multipliers_;     // [layer][max_ngram_size]
  std::vector<int64_t> column_primes_;                // [layer * n_columns + c]
  std::vector<int64_t> column_offsets_;               // [layer * n_columns + c]
};

// torch's int64 `%` (remainder): the result takes the sign of the divisor (Python semantics).
// divisor != 0; the INT64_MIN % -1 case gives 0.
inline int64_t torch_remainder_i64(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

}  // namespace cedar::model
