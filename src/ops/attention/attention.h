// Sparse MQA attention (spec §2.6; kernel.py sparse_attn) and the indexer helpers (spec §4.4 step 4).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar {
class ThreadPool;
}

namespace cedar::ops {

inline constexpr size_t kSparseAttnBlock = 64;  // indices are consumed in blocks of 64 (K41:328)
inline constexpr float kSparseAttnMaxInit = -1e30f;
inline constexpr size_t kSparseAttnMaxHeadDim = 1024;  // the kernel keeps one row on the stack

// The KV operand: logical rows [0, first_rows) come from `first`, rows [first_rows, first_rows +
// second_rows) from `second` (so the window ring and the compressed cache need not be concatenated).
// Each row holds head_dim floats (bf16 values); K = V = the row. Either segment may be empty.
struct KvRows {
  const float* first = nullptr;
  size_t first_rows = 0;
  const float* second = nullptr;
  size_t second_rows = 0;
  const float* row(size_t i, size_t head_dim) const {
    return i < first_rows ? first + i * head_dim : second + (i - first_rows) * head_dim;
  }
  size_t rows() const { return first_rows + second_rows; }
};

// One query row (one token) of sparse attention with an attention sink:
//   q    [n_heads, head_dim]  bf16 values          sink [n_heads] f32 (logit, NOT scaled)
//   idx  [n_idx]  int32 row numbers into kv, -1 = masked (contributes nothing); each valid index must
//        be < kv.rows() (CEDAR_CHECK).
//   out  [n_heads, head_dim]  bf16 values (must not alias q; head_dim <= kSparseAttnMaxHeadDim)
// For each head, blocks of 64 indices in the given order (numerics contract, docs/NUMERICS.md §1):
//   s_j = f32(q·kv[idx_j]) * scale      exact dot rounded once (dot_canonical.h), then the f32 scale;
//                                        masked: -inf
//   m' = max(m, max_j s_j) (m starts at -1e30);  alpha = exp(m - m');  p_j = exp(s_j - m')
//                                        (f32 differences, exp in double rounded once: exact_math.h)
//   den = den*alpha + f32(Σ_j p_j)       the block sum in float64, rounded once
//   acc = acc*alpha + f32(Σ_j bf16(p_j) * kv[idx_j])   the block's P·V per element in float64 (exact
//                                        products, index order), rounded once, then added in f32
// then den += exp(sink - m); out = bf16(acc / den). All-masked rows give zeros.
// The fast path is bit-identical to ref::sparse_attn on every target. `pool` (may be nullptr) splits
// the heads.
void sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                 const int32_t* idx, size_t n_idx, float scale, float* out, ThreadPool* pool);

namespace fast {
// sparse_attn of `--numerics fast` (attention_fast.cc): the same blocks, running maximum, bf16(p)
// and sink, with the dots, the P·V sums and the denominator in fp32 registers and p = exp(s - m') by
// Highway's Exp (1 ulp). The difference from the exact op is bounded per output element by the
// rounding of p to bf16 flipping (2^-8 of a term) plus the fp32 sums' errors (docs/NUMERICS.md §10;
// tested in attention_test.cc). Inputs with infinities or NaN are not bounded.
void sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                 const int32_t* idx, size_t n_idx, float scale, float* out, ThreadPool* pool);
}  // namespace fast

// Indexer scores for one query token against n_keys index keys (reference einsum "bshd,btd->bsht"
// on bf16 tensors, then relu, * weights, sum over heads), under the numerics contract:
//   d_ht   = bf16( f32( Σ_k q[h,k] * key[t,k] ) )   exact dot rounded once, then to bf16 (a bf16 matmul)
//   p_ht   = bf16( relu(d_ht) * w[h] )              bf16 elementwise multiply (computed in f32, rounded)
//   score_t = bf16( f32( Σ_h p_ht ) )               the head sum of a bf16 tensor: float64, rounded once
//                                                   to fp32, then to bf16
//   q [n_heads, head_dim] (bf16 values, FP4-QDQ'd), w [n_heads] (bf16 values, already scaled),
//   keys [n_keys, head_dim], scores [n_keys]. Bit-identical to ref::indexer_scores on every target;
//   `pool` (may be nullptr) splits the keys.
//   key_spread [n_keys] (may be nullptr): exact_sum_spread of each key row, which lets a dot whose
//   products provably sum exactly in fp32 run on fp32 vectors (the result is the same exact value,
//   so scores stay bit-identical); without it, or when the bound fails, the float64 dot runs.
//   key_tiles (may be nullptr): the same keys as FP4 codes in int8 tiles (IndexKeyTiles), which
//   lets 16 keys' block sums run as exact integer pairwise multiply-adds when q is FP4 too (its
//   values E2M1 times a power of two per 32), combined in float64; other queries take the rows.
struct IndexKeyTiles {
  const uint8_t* codes = nullptr;  // index_key_tile_code_bytes
  const double* scales = nullptr;  // index_key_tile_scale_count
};
//   tile_mask (may be nullptr): one flag per kIndexKeyTile keys; only the keys of flagged tiles are
//   scored, the other scores are left as they are (a query that can only pick some keys, e.g. those
//   of a candidate pool, skips the rest).
void indexer_scores(const float* q, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                    size_t n_keys, float* scores, ThreadPool* pool, const uint8_t* key_spread = nullptr,
                    const IndexKeyTiles* key_tiles = nullptr, const uint8_t* tile_mask = nullptr);

// Index keys key-major in tiles of kIndexKeyTile for the integer indexer: tile j holds keys
// 16j..16j+15. Codes: per four dimensions (4p..4p+3), 64 bytes [key][4] of 2·E2M1 + 12 (0..24, so
// that they are unsigned; a key's four codes are one int32 lane of an unsigned x signed byte dot). Scales: per block of 32 dimensions, the 16 keys' block scale / 2 as
// doubles (the codes are twice the E2M1 values). head_dim must be a multiple of 32.
inline constexpr size_t kIndexKeyTile = 16;
inline size_t index_key_tile_code_bytes(size_t n_keys, size_t head_dim) {
  return (n_keys + kIndexKeyTile - 1) / kIndexKeyTile * kIndexKeyTile * head_dim;
}
inline size_t index_key_tile_scale_count(size_t n_keys, size_t head_dim) {
  return (n_keys + kIndexKeyTile - 1) / kIndexKeyTile * kIndexKeyTile * (head_dim / 32);
}
// Writes key t (FP4: E2M1 codes, even element in the low nibble, one E8M0 scale per 32) into the tiles.
void append_index_key_tile(const uint8_t* packed, const uint8_t* scales_e8m0, size_t head_dim, size_t t,
                           uint8_t* codes, double* scales);
// The integer tiles' float64 sum of `blocks` block terms is exact while a key's largest block scale
// over its smallest, times the query's, is at most this: every term is an integer below 2^13 times a
// power of two, so the sum stays an exact multiple of the smallest unit below 2^53 for
// blocks · 2^13 · ratio <= 2^53.
inline double index_tile_exact_ratio(size_t blocks) {
  int log2_blocks = 0;
  while ((size_t{1} << log2_blocks) < blocks) ++log2_blocks;
  return static_cast<double>(uint64_t{1} << (40 - log2_blocks));
}

// The binades between the largest value of v[n] and the lowest set bit of any nonzero value:
// floor(log2 max|v|) - min over nonzero v of (exponent of its lowest set bit). Every v is a multiple
// of 2^L with |v| < 2^(L + spread + 1). 0 for an all-zero v; kNoExactSpread for a NaN, an infinity,
// or values beyond 2^±60 (where fp32 products could underflow or overflow).
// FP4 rows (E2M1 x a power-of-two scale per 32) have spread 3 plus the binades between their block
// scales, so two FP4 rows' products sum exactly in fp32 whenever their spreads are small.
inline constexpr uint8_t kNoExactSpread = 255;
uint8_t exact_sum_spread(const float* v, size_t n);
// exact_sum_spread of the dequantised FP4 row (E2M1 codes, even element in the low nibble, and one
// E8M0 scale per 32), read from the packed bytes: which magnitudes each block holds gives its top and
// lowest bits without decoding (an index key per decode step, so this must be cheap).
uint8_t exact_sum_spread_fp4(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n);

// Top-k selection as the reference uses it: the k largest scores (k <= n), returned as indices in
// ascending index order (topk(sorted=False) followed by sort()). Ties: among equal scores the lower
// index wins (torch.topk leaves tie order unspecified; preferring the earlier position is
// deterministic and matches a stable sort). NaN ranks above +inf (torch treats NaN as the largest);
// -inf entries are ordinary values and are selected when fewer than k finite ones exist.
// `scratch` needs n int32 slots. Returns nothing; out_idx [k].
void topk_ascending(const float* scores, size_t n, size_t k, int32_t* out_idx, int32_t* scratch);

namespace ref {
void sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                 const int32_t* idx, size_t n_idx, float scale, float* out);
void indexer_scores(const float* q, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                    size_t n_keys, float* scores);
}  // namespace ref

}  // namespace cedar::ops
