#include "spec/engram_layout.h"

#include <set>

namespace cedar::model {
namespace {

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t pow_mod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  while (e) {
    if (e & 1) r = mul_mod(r, a, m);
    a = mul_mod(a, a, m);
    e >>= 1;
  }
  return r;
}

}  // namespace

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  // These 12 bases decide primality exactly for every n < 2^64.
  for (uint64_t a : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

EngramLayout make_engram_layout(const ModelConfig& c) {
  EngramLayout L;
  L.n_orders = c.engram_max_ngram_size - 1;
  L.n_heads = c.engram_n_heads;
  L.head_dim = c.engram_head_dim;
  std::set<int64_t> seen;
  for (size_t layer = 0; layer < c.engram_layer_ids.size(); ++layer) {
    std::vector<std::vector<int64_t>> per_order;
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int o = 0; o < L.n_orders; ++o) {
      std::vector<int64_t> sizes;
      int64_t current = c.engram_vocab_size - 1;
      for (int h = 0; h < L.n_heads; ++h) {
        int64_t cand = current + 1;
        while (!is_prime_u64(static_cast<uint64_t>(cand)) || seen.count(cand)) ++cand;
        seen.insert(cand);
        current = cand;
        sizes.push_back(cand);
        offsets.push_back(total);
        total += cand;
      }
      per_order.push_back(std::move(sizes));
    }
    L.primes.push_back(std::move(per_order));
    L.offsets.push_back(std::move(offsets));
    L.rows.push_back(total);
  }
  return L;
}

}  // namespace cedar::model
