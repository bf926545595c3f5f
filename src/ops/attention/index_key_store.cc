#include "ops/attention/index_key_store.h"

#include "core/check.h"
#include "ops/attention/attention.h"
#include "ops/formats/quant.h"

namespace cedar::ops {

void IndexKeyStore::truncate(size_t n) {
  CEDAR_CHECK(n <= n_, "index key store: truncate to %zu of %zu keys", n, n_);
  n_ = n;
}

void IndexKeyStore::append(const uint8_t* entries, size_t count) {
  CEDAR_CHECK(head_dim_ > 0 && head_dim_ % 32 == 0, "index key store: head_dim %zu is not a multiple of 32", head_dim_);
  const size_t n = n_ + count, d = head_dim_, bytes = entry_bytes();
  if (rows_.size() < n * d) rows_.resize(n * d);
  if (spread_.size() < n) spread_.resize(n);
  if (tile_codes_.size() < index_key_tile_code_bytes(n, d)) tile_codes_.resize(index_key_tile_code_bytes(n, d));
  if (tile_scales_.size() < index_key_tile_scale_count(n, d)) tile_scales_.resize(index_key_tile_scale_count(n, d));
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* packed = entries + i * bytes;
    const uint8_t* scales = packed + d / 2;
    const size_t t = n_ + i;
    fp4_dequant_e8m0(packed, scales, d, rows_.data() + t * d);
    spread_[t] = exact_sum_spread_fp4(packed, scales, d);
    append_index_key_tile(packed, scales, d, t, tile_codes_.data(), tile_scales_.data());
  }
  n_ = n;
}

void IndexKeyStore::scores(const float* q, const float* w, size_t n_heads, size_t n_keys, float* out, ThreadPool* pool,
                           const uint8_t* tile_mask) const {
  CEDAR_CHECK(n_keys <= n_, "index key store: %zu keys scored of %zu held", n_keys, n_);
  const IndexKeyTiles tiles{tile_codes_.data(), tile_scales_.data()};
  indexer_scores(q, w, n_heads, head_dim_, rows_.data(), n_keys, out, pool, spread_.data(), &tiles, tile_mask);
}

}  // namespace cedar::ops
