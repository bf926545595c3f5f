// Engram bucket layout (spec §4.3, engram.py EngramLayout): for every Engram layer and every
// n-gram order 2..max_ngram_size, `n_heads` prime bucket sizes. The primes are handed out in
// (layer, order, head) order, each the smallest prime above the running start that was not handed
// out before; each (layer, order) list restarts its search at engram_vocab_size - 1.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/config.h"

namespace cedar::model {

struct EngramLayout {
  int n_orders = 0;   // max_ngram_size - 1 (orders 2..max_ngram_size)
  int n_heads = 0;
  int head_dim = 0;
  // [engram layer][order - 2][head]
  std::vector<std::vector<std::vector<int64_t>>> primes;
  // [engram layer][column c = (order - 2) * n_heads + head]: exclusive prefix sum of that layer's primes
  std::vector<std::vector<int64_t>> offsets;
  // Rows of each layer's table (the sum of its primes); must equal engram_num_embeddings.
  std::vector<int64_t> rows;

  int n_columns() const { return n_orders * n_heads; }
};

// Builds the layout from the Engram fields of `c` (engram_layer_ids, engram_max_ngram_size,
// engram_n_heads, engram_vocab_size). Does not look at engram_num_embeddings.
EngramLayout make_engram_layout(const ModelConfig& c);

// Deterministic primality for 64-bit values (Miller-Rabin with a base set proven exact for n < 2^64).
bool is_prime_u64(uint64_t n);

}  // namespace cedar::model
