#include "model/engram_hash.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/check.h"

namespace cedar::model {
namespace numpy_random {
namespace {

// numpy/random/bit_generator.pyx: SeedSequence constants.
constexpr size_t kPoolSize = 4;
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;  // half the bits of a uint32 word

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// _int_to_uint32_array: little-endian 32-bit words of a non-negative integer; zero is one word.
std::vector<uint32_t> entropy_words(uint64_t entropy) {
  std::vector<uint32_t> words;
  if (entropy == 0) words.push_back(0);
  while (entropy > 0) {
    words.push_back(static_cast<uint32_t>(entropy & 0xFFFFFFFFu));
    entropy >>= 32;
  }
  return words;
}

// SeedSequence.mix_entropy: the 4-word pool from the entropy words (no spawn key, so no padding).
std::vector<uint32_t> seed_pool(uint64_t entropy) {
  const std::vector<uint32_t> ent = entropy_words(entropy);
  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < ent.size() ? ent[i] : 0u, hash_const);
  for (size_t src = 0; src < kPoolSize; ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  // Entropy longer than the pool is folded in afterwards (only for seeds >= 2^128; kept for fidelity).
  for (size_t src = kPoolSize; src < ent.size(); ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(ent[src], hash_const));
  }
  return pool;
}

// pcg64.h: PCG_DEFAULT_MULTIPLIER_128.
constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ull) << 64) | 4865540595714422341ull;

// distributions.c: bounded_lemire_uint64 (range [0, rng], rng < 2^64 - 1).
uint64_t bounded_lemire_u64(Pcg64& gen, uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  unsigned __int128 m = static_cast<unsigned __int128>(gen.next_u64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    // 2^64 mod rng_excl: products whose low word falls below it would bias the high word.
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<unsigned __int128>(gen.next_u64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// distributions.c: buffered_bounded_lemire_uint32 (range [0, rng], rng < 2^32 - 1). numpy's 32-bit
// "buffer" argument is unused; the draws come from the bit generator's own next_uint32.
uint32_t bounded_lemire_u32(Pcg64& gen, uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(gen.next_u32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(gen.next_u32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

}  // namespace

std::vector<uint32_t> seed_sequence_state_u32(uint64_t entropy, size_t n_words) {
  const std::vector<uint32_t> pool = seed_pool(entropy);
  std::vector<uint32_t> state(n_words);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    state[i] = v;
  }
  return state;
}

std::vector<uint64_t> seed_sequence_state_u64(uint64_t entropy, size_t n_words) {
  const std::vector<uint32_t> w = seed_sequence_state_u32(entropy, 2 * n_words);
  std::vector<uint64_t> out(n_words);
  for (size_t i = 0; i < n_words; ++i)
    out[i] = static_cast<uint64_t>(w[2 * i]) | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  return out;
}

Pcg64::Pcg64(uint64_t seed) {
  // PCG64._reset_state_variables + pcg64_set_seed: state words (s0, s1) = 128-bit initstate
  // s0:s1, increment words (s2, s3) = initseq; then pcg_setseq_128_srandom_r.
  const std::vector<uint64_t> s = seed_sequence_state_u64(seed, 4);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(s[0]) << 64) | s[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(s[2]) << 64) | s[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  step();
  state_ += initstate;
  step();
}

void Pcg64::step() { state_ = state_ * kPcgMultiplier + inc_; }

uint64_t Pcg64::next_u64() {
  step();
  const uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (folded >> rot) | (folded << ((64u - rot) & 63u));
}

uint32_t Pcg64::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return buffered_u32_;
  }
  const uint64_t next = next_u64();
  has_u32_ = true;
  buffered_u32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

std::vector<int64_t> integers_int64(Pcg64& gen, int64_t low, int64_t high, size_t count) {
  CEDAR_CHECK(low < high, "integers_int64: empty range [%lld, %lld)", static_cast<long long>(low),
              static_cast<long long>(high));
  // _rand_int64: closed interval [low, high - 1], rng = (high - 1) - low as uint64, off = low.
  const uint64_t rng = static_cast<uint64_t>(high - 1) - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  std::vector<int64_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t v;
    if (rng == 0) {
      v = 0;  // numpy draws nothing for a one-value range
    } else if (rng <= 0xFFFFFFFFull) {
      v = rng == 0xFFFFFFFFull ? gen.next_u32() : bounded_lemire_u32(gen, static_cast<uint32_t>(rng));
    } else if (rng == std::numeric_limits<uint64_t>::max()) {
      v = gen.next_u64();  // unreachable with an exclusive int64 bound; kept to mirror numpy
    } else {
      v = bounded_lemire_u64(gen, rng);
    }
    out[i] = static_cast<int64_t>(off + v);
  }
  return out;
}

}  // namespace numpy_random

std::vector<std::vector<int64_t>> engram_multipliers(const std::vector<int>& layer_ids, int max_ngram_size,
                                                     int64_t compressed_vocab_size) {
  CEDAR_CHECK(compressed_vocab_size > 0, "compressed vocab size %lld", static_cast<long long>(compressed_vocab_size));
  CEDAR_CHECK(max_ngram_size >= 1, "max_ngram_size %d", max_ngram_size);
  const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab_size) / 2);
  std::vector<std::vector<int64_t>> rows;
  for (int layer_id : layer_ids) {
    CEDAR_CHECK(layer_id >= 0, "negative engram layer id %d", layer_id);
    numpy_random::Pcg64 gen(10007ull * static_cast<uint64_t>(layer_id));
    std::vector<int64_t> v = numpy_random::integers_int64(gen, 0, bound, static_cast<size_t>(max_ngram_size));
    // v < bound <= INT64_MAX / 2, so 2v + 1 cannot overflow.
    for (int64_t& x : v) x = x * 2 + 1;
    rows.push_back(std::move(v));
  }
  return rows;
}

Result<NgramHasher> NgramHasher::create(const ModelConfig& config, const EngramLayout& layout,
                                        std::vector<int32_t> token_map) {
  const int n_layers = static_cast<int>(config.engram_layer_ids.size());
  if (n_layers == 0) return invalid_argument("engram: config has no engram_layer_ids; nothing to hash");
  if (config.engram_max_ngram_size < 2)
    return invalid_argument("engram: engram_max_ngram_size must be >= 2 (got " +
                            std::to_string(config.engram_max_ngram_size) + ")");
  if (static_cast<int>(layout.primes.size()) != n_layers || layout.n_orders != config.engram_max_ngram_size - 1 ||
      layout.n_heads != config.engram_n_heads)
    return invalid_argument("engram: the EngramLayout was not built from this config (make_engram_layout(config))");
  const int64_t cvs = config.engram_compressed_vocab_size;
  if (cvs <= 0) return invalid_argument("engram: engram_compressed_vocab_size must be > 0");
  if (token_map.empty()) return invalid_argument("engram: the compressed token map is empty");
  if (config.engram_pad_id < 0 || static_cast<size_t>(config.engram_pad_id) >= token_map.size())
    return invalid_argument("engram: engram_pad_token_id " + std::to_string(config.engram_pad_id) +
                            " is outside the token map (" + std::to_string(token_map.size()) + " tokens)");
  int32_t max_class = -1;
  for (size_t t = 0; t < token_map.size(); ++t) {
    if (token_map[t] < 0 || token_map[t] >= cvs)
      return invalid_argument("engram: the compressed token map gives token " + std::to_string(t) + " class " +
                              std::to_string(token_map[t]) + ", outside [0, engram_compressed_vocab_size=" +
                              std::to_string(cvs) + "); rebuild the map from this checkpoint's tokenizer");
    max_class = std::max(max_class, token_map[t]);
  }
  // Classes are numbered densely in order of first appearance, so the count is max + 1. The
  // multipliers derive from the count: a mismatch would silently rehash every n-gram.
  if (max_class + 1 != cvs)
    return invalid_argument("engram: the compressed token map has " + std::to_string(max_class + 1) +
                            " classes but config.json's engram_compressed_vocab_size is " + std::to_string(cvs) +
                            "; the tokenizer and the checkpoint do not belong together");

  NgramHasher h;
  h.n_layers_ = n_layers;
  h.max_ngram_size_ = config.engram_max_ngram_size;
  h.n_heads_ = layout.n_heads;
  h.n_columns_ = layout.n_columns();
  h.pad_id_ = token_map[static_cast<size_t>(config.engram_pad_id)];
  h.token_map_ = std::move(token_map);
  h.multipliers_ = engram_multipliers(config.engram_layer_ids, h.max_ngram_size_, cvs);
  h.column_primes_.resize(static_cast<size_t>(n_layers) * h.n_columns_);
  h.column_offsets_.resize(h.column_primes_.size());
  for (int l = 0; l < n_layers; ++l) {
    for (int o = 0; o < layout.n_orders; ++o) {
      for (int hd = 0; hd < layout.n_heads; ++hd) {
        const size_t c = static_cast<size_t>(o) * layout.n_heads + hd;
        const size_t at = static_cast<size_t>(l) * h.n_columns_ + c;
        h.column_primes_[at] = layout.primes[l][o][hd];
        h.column_offsets_[at] = layout.offsets[l][c];
      }
    }
  }
  return h;
}

Status NgramHasher::hash(EngramHistory& history, int64_t start_pos, std::span<const int32_t> token_ids,
                         std::span<const uint8_t> takes_part, std::span<int64_t> row_ids) const {
  const size_t n = token_ids.size();
  if (start_pos < 0 || start_pos > history.size())
    return invalid_argument("engram hash: start_pos " + std::to_string(start_pos) +
                            " but the sequence history holds " + std::to_string(history.size()) +
                            " positions (positions before start_pos must be hashed first)");
  if (!takes_part.empty() && takes_part.size() != n)
    return invalid_argument("engram hash: " + std::to_string(takes_part.size()) + " text/image flags for " +
                            std::to_string(n) + " tokens");
  const size_t per_token = static_cast<size_t>(n_layers_) * n_columns_;
  if (row_ids.size() != n * per_token)
    return invalid_argument("engram hash: row_ids holds " + std::to_string(row_ids.size()) + " values, needs " +
                            std::to_string(n * per_token) + " ([n_tokens, n_engram_layers, n_columns])");
  for (size_t t = 0; t < n; ++t) {
    if (token_ids[t] < 0 || static_cast<size_t>(token_ids[t]) >= token_map_.size())
      return invalid_argument("engram hash: token id " + std::to_string(token_ids[t]) + " at position " +
                              std::to_string(start_pos + static_cast<int64_t>(t)) + " is outside the vocabulary (" +
                              std::to_string(token_map_.size()) + " tokens)");
  }

  // NgramHashState writes the chunk's compressed ids into its per-sequence cache first, then looks
  // back through that cache; cutting at start_pos and appending is the same thing.
  history.compressed.resize(static_cast<size_t>(start_pos));
  for (size_t t = 0; t < n; ++t) {
    const bool text = takes_part.empty() || takes_part[t] != 0;
    history.compressed.push_back(text ? token_map_[static_cast<size_t>(token_ids[t])] : kEngramDead);
  }

  const int N = max_ngram_size_;
  std::vector<int64_t> u(static_cast<size_t>(N));  // [max_ngram_size] ids at i, i-1, ..., i-N+1
  for (size_t t = 0; t < n; ++t) {
    const int64_t i = start_pos + static_cast<int64_t>(t);
    bool blocked = false;
    for (int k = 0; k < N; ++k) {
      // Once the look-back hits the sequence start or a DEAD position, every older slot is pad too.
      if (!blocked && (i - k < 0 || history.compressed[static_cast<size_t>(i - k)] == kEngramDead)) blocked = true;
      u[static_cast<size_t>(k)] = blocked ? pad_id_ : history.compressed[static_cast<size_t>(i - k)];
    }
    int64_t* out = row_ids.data() + t * per_token;  // [n_layers, n_columns]
    for (int l = 0; l < n_layers_; ++l) {
      const std::vector<int64_t>& m = multipliers_[static_cast<size_t>(l)];
      // int64 products and XOR, wrapping like torch's int64 multiply; done in uint64 where
      // wrap-around is defined (the products never exceed INT64_MAX for valid ids anyway).
      uint64_t rolling = static_cast<uint64_t>(u[0]) * static_cast<uint64_t>(m[0]);
      const size_t base = static_cast<size_t>(l) * n_columns_;
      for (int k = 1; k < N; ++k) {
        rolling ^= static_cast<uint64_t>(u[static_cast<size_t>(k)]) * static_cast<uint64_t>(m[static_cast<size_t>(k)]);
        const int64_t r = static_cast<int64_t>(rolling);
        for (int hd = 0; hd < n_heads_; ++hd) {
          const size_t c = static_cast<size_t>(k - 1) * n_heads_ + hd;
          out[base + c] = column_offsets_[base + c] + torch_remainder_i64(r, column_primes_[base + c]);
        }
      }
    }
  }
  return Status::ok_status();
}

}  // namespace cedar::model
