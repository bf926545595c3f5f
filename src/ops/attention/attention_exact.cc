// Fast paths of attention.h (Highway). The q·k and q·key dot products are the canonical float64 dots
// of dot_canonical.h and the P·V sums run element-wise in float64 in index order with exact products,
// so both kernels are bit-identical to their ref:: versions on every target.
#include "ops/attention/attention.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/attention/x86_indexer_tiles.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/attention_exact.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/simd/bf16_round-inl.h"
#include "ops/attention/attention_block-inl.h"
#include "ops/simd/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[d] += p * v[d] in float64 (p and v bf16 values: the product is exact, so the fused add equals
// the scalar product-then-add), d = 0..n-1.
HWY_INLINE void AxpyF64(double p, const float* v, double* acc, size_t n) {
  const DotTagD dd;
  const size_t lanes = hn::Lanes(dd);
  const auto pv = hn::Set(dd, p);
  size_t d = 0;
  for (; d + lanes <= n; d += lanes) {
    hn::StoreU(hn::MulAdd(pv, LoadF32AsF64(dd, v + d), hn::LoadU(dd, acc + d)), dd, acc + d);
  }
  for (; d < n; ++d) acc[d] += p * static_cast<double>(v[d]);
}

// acc[d] = acc[d] * alpha + f32(add[d]) (fp32, separate roundings, like the reference).
HWY_INLINE void ScaleAddRounded(float* acc, float alpha, const double* add, size_t n) {
  const DotTagD dd;
  const DotTagF df;
  const size_t lanes = hn::Lanes(dd);
  const auto av = hn::Set(df, alpha);
  size_t d = 0;
  for (; d + lanes <= n; d += lanes) {
    const auto rounded = hn::DemoteTo(df, hn::LoadU(dd, add + d));
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(df, acc + d), av), rounded), df, acc + d);
  }
  for (; d < n; ++d) acc[d] = acc[d] * alpha + static_cast<float>(add[d]);
}

void SparseAttnHeads(const float* q, size_t head_dim, const KvRows* kv_ptr, const float* sink,
                     const int32_t* idx, size_t n_idx, float scale, float* out, size_t h_begin,
                     size_t h_end) {
  const KvRows& kv = *kv_ptr;
  HWY_ALIGN double block_pv[kSparseAttnMaxHeadDim];  // [head_dim] this block's exact Σ_j bf16(p_j)·v_j
  for (size_t h = h_begin; h < h_end; ++h) {
    const float* qh = q + h * head_dim;
    float* acc = out + h * head_dim;  // [head_dim] numerator, kept in the output row until the end
    std::fill(acc, acc + head_dim, 0.0f);
    float running_max = kSparseAttnMaxInit;
    float den = 0.0f;
    for (size_t start = 0; start < n_idx; start += kSparseAttnBlock) {
      const size_t nb = std::min(kSparseAttnBlock, n_idx - start);
      float score[kSparseAttnBlock];
      const float* rows[kSparseAttnBlock];
      const float block_max = SparseAttnBlockScores(
          qh, kv, idx + start, nb, head_dim, scale,
          [](const float* a, const float* b, size_t n) { return DotCanonical(a, b, n); }, rows, score);
      const float new_max = std::max(running_max, block_max);
      const float alpha = exp_f32(running_max - new_max);
      double p_sum = 0.0;
      std::fill(block_pv, block_pv + head_dim, 0.0);
      for (size_t j = 0; j < nb; ++j) {
        const float p = exp_f32(score[j] - new_max);
        p_sum += static_cast<double>(p);
        if (rows[j] != nullptr) AxpyF64(static_cast<double>(round_bf16(p)), rows[j], block_pv, head_dim);
      }
      den = den * alpha + static_cast<float>(p_sum);
      ScaleAddRounded(acc, alpha, block_pv, head_dim);
      running_max = new_max;
    }
    den += exp_f32(sink[h] - running_max);
    for (size_t d = 0; d < head_dim; ++d) acc[d] = round_bf16(acc[d] / den);
  }
}

// A dot of rows with spreads sa and sb sums exactly in fp32 when sa + sb + 2 + ceil(log2(n)) <= 24:
// every product is a multiple of 2^(La + Lb) and Σ|products| < n · 2^(La + sa + 1) · 2^(Lb + sb + 1).
int ExactSpreadLimit(size_t n) {
  int log2n = 0;
  while ((size_t{1} << log2n) < n) ++log2n;
  return 22 - log2n;
}

// q_spread: exact_sum_spread of each head's q (indexer_scores computes them once per query), or
// nullptr with key_spread == nullptr (every dot in float64).
void IndexerScoresRange(const float* q, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                        const uint8_t* key_spread, const int* q_spread, float* scores, size_t t_begin,
                        size_t t_end) {
  const int limit = ExactSpreadLimit(head_dim);
  for (size_t t = t_begin; t < t_end; ++t) {
    const float* key = keys + t * head_dim;
    const int ks = key_spread != nullptr ? key_spread[t] : 1 << 20;
    double sum = 0.0;
    for (size_t h = 0; h < n_heads; ++h) {
      const float* qh = q + h * head_dim;
      // Within the spread limit every partial sum is exact in fp32, so the fp32 dot is the exact one.
      const float dot = key_spread != nullptr && q_spread[h] + ks <= limit ? DotF32(qh, key, head_dim)
                                                                           : DotCanonical(qh, key, head_dim);
      const float d = round_bf16(dot);
      const float relu = d > 0.0f ? d : 0.0f;
      sum += static_cast<double>(round_bf16(relu * w[h]));
    }
    scores[t] = round_bf16(static_cast<float>(sum));
  }
}


// The 16 keys' integer block sums Σ c_q · c_k for one block of 32 dimensions, as two vectors of 8
// int32 (keys 0-7, 8-15). The keys' codes are stored + 12 (unsigned, for the u8 x i8 pairwise
// multiply-add), four dimensions per key together (IndexKeyTiles); 12 · Σ c_q is taken off once.
// Each int16 lane adds the pairwise sums of 8 quads: at most 8 · 2 · 24 · 12 = 4,608, so it never
// saturates and the sums are exact; one multiply-add by ones then joins a key's two lanes.
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE void TileBlockSums(const uint8_t* kcodes, const int8_t* qcodes, int16_t offset_sum,
                              hn::Vec<hn::Full256<int32_t>>* lo, hn::Vec<hn::Full256<int32_t>>* hi) {
  __m256i acc_lo = _mm256_setzero_si256(), acc_hi = _mm256_setzero_si256();
  for (size_t quad = 0; quad < 8; ++quad) {
    int32_t four;
    std::memcpy(&four, qcodes + 4 * quad, 4);
    const __m256i qv = _mm256_set1_epi32(four);
    const uint8_t* k = kcodes + quad * 4 * kIndexKeyTile;
    acc_lo = _mm256_add_epi16(acc_lo, _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k)), qv));
    acc_hi =
        _mm256_add_epi16(acc_hi, _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 32)), qv));
  }
  const __m256i ones = _mm256_set1_epi16(1), offset = _mm256_set1_epi32(offset_sum);
  lo->raw = _mm256_sub_epi32(_mm256_madd_epi16(acc_lo, ones), offset);
  hi->raw = _mm256_sub_epi32(_mm256_madd_epi16(acc_hi, ones), offset);
}
#endif

// One head's dots with the 16 keys of a tile: Σ_b (integer block sum) · (key scale · query scale),
// the float64 terms added in block order and rounded once to fp32. qc, qs, qo: the head's codes,
// block scales and offsets (IndexerScoresTiles).
HWY_INLINE void TileHeadDots(const uint8_t* tile_codes, const double* tile_scales, size_t blocks, const int8_t* qc,
                             const double* qs, const int16_t* qo, float* dot) {
  constexpr size_t kTile = kIndexKeyTile;
#if HWY_TARGET <= HWY_AVX2
  const hn::Full256<double> d4;
  const hn::Full128<int32_t> di4;
  hn::Vec<decltype(d4)> acc[4] = {hn::Zero(d4), hn::Zero(d4), hn::Zero(d4), hn::Zero(d4)};
  for (size_t b = 0; b < blocks; ++b) {
    hn::Vec<hn::Full256<int32_t>> lo, hi;
    TileBlockSums(tile_codes + b * 32 * kTile, qc + b * 32, qo[b], &lo, &hi);
    const auto s = hn::Set(d4, qs[b]);
    const double* ks = tile_scales + b * kTile;
    const hn::Vec<decltype(di4)> parts[4] = {hn::LowerHalf(di4, lo), hn::UpperHalf(di4, lo), hn::LowerHalf(di4, hi),
                                             hn::UpperHalf(di4, hi)};
    for (size_t v = 0; v < 4; ++v)
      acc[v] = hn::MulAdd(hn::PromoteTo(d4, parts[v]), hn::Mul(hn::LoadU(d4, ks + 4 * v), s), acc[v]);
  }
  for (size_t v = 0; v < 4; ++v) hn::StoreU(hn::DemoteTo(hn::Full128<float>(), acc[v]), hn::Full128<float>(), dot + 4 * v);
#else
  // Other targets: the same integer block sums and float64 sum, one key at a time.
  for (size_t i = 0; i < kTile; ++i) {
    double acc = 0.0;
    for (size_t b = 0; b < blocks; ++b) {
      int32_t block_sum = 0;
      for (size_t quad = 0; quad < 8; ++quad)
        for (size_t j = 0; j < 4; ++j)
          block_sum += qc[b * 32 + 4 * quad + j] *
                       (static_cast<int32_t>(tile_codes[((b * 8 + quad) * kTile + i) * 4 + j]) - 12);
      acc += static_cast<double>(block_sum) * (tile_scales[b * kTile + i] * qs[b]);
    }
    dot[i] = static_cast<float>(acc);
  }
#endif
}

// The indexer over integer key tiles (IndexKeyTiles in attention.h), 16 keys at a time. Each head's
// 16 dots are Σ_blocks (block sum) · (key scale · query scale) in float64, rounded once to fp32: the
// block sums are exact integers below 2^13 and the scales powers of two, so every term is exact, and
// while a key's and the query's scales each stay within a ratio whose product is at most
// kTileExactRatio, every partial sum is an exact multiple of the smallest term's unit below 2^53.
// The float64 sum is then the exact dot, and its one rounding is the contract's. A key lane beyond
// that ratio (or with a NaN scale) gets the float64 row dot instead. Then bf16 rounding, relu, the
// weight and the float64 head sum on vectors, in the scalar kernel's order.
// [t_begin, t_end): t_begin a multiple of 16. The query in the integer form: per head and block of
// 32, codes q_codes with q = code · q_scale (|code| <= 12, the scale a power of two), q_offset =
// 12 · Σ code (what the keys' +12 offset adds to a block sum), and per head q_ratio, its largest
// block scale over its smallest.
void IndexerScoresTiles(const float* q, const int8_t* q_codes, const double* q_scale, const int16_t* q_offset,
                        const double* q_ratio, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                        const IndexKeyTiles& tiles, float* scores, size_t t_begin, size_t t_end) {
  constexpr size_t kTile = kIndexKeyTile;
  CEDAR_CHECK(t_begin % kTile == 0, "indexer tiles: range start %zu is not a tile boundary", t_begin);
  const size_t blocks = head_dim / 32;
  const double exact_ratio = index_tile_exact_ratio(blocks);
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfd;  // floats promoted to the float64 head sums
  constexpr size_t dlanes = hn::MaxLanes(dd);
  HWY_ALIGN float dot[kTile];
  // AVX512-VNNI CPUs take every head's dots of a tile at once (x86_indexer_tiles.h); indexer_scores
  // sends no more heads here than that kernel takes.
  const bool vnni = x86::indexer_tiles_vnni_usable();
  HWY_ALIGN float vnni_dots[x86::kIndexerTileMaxHeads * kTile];
  HWY_ALIGN double sum[kTile];
  double key_ratio[kTile];
  for (size_t t0 = t_begin; t0 < t_end; t0 += kTile) {
    const size_t valid = std::min(kTile, t_end - t0);
    const uint8_t* tile_codes = tiles.codes + (t0 / kTile) * head_dim * kTile;
    const double* tile_scales = tiles.scales + (t0 / kTile) * blocks * kTile;
    double widest = 0.0;  // the tile's widest key: one test per head when all lanes qualify
    for (size_t i = 0; i < kTile; ++i) {
      double lo = tile_scales[i], hi = tile_scales[i];
      for (size_t b = 1; b < blocks; ++b) {
        lo = std::min(lo, tile_scales[b * kTile + i]);
        hi = std::max(hi, tile_scales[b * kTile + i]);
      }
      key_ratio[i] = hi / lo;  // NaN for a NaN scale: never below the bound
      for (size_t b = 0; b < blocks; ++b) key_ratio[i] = std::isnan(tile_scales[b * kTile + i]) ? NAN : key_ratio[i];
      if (i < valid) widest = std::isnan(key_ratio[i]) || std::isnan(widest) ? NAN : std::max(widest, key_ratio[i]);
    }
    // The head sums stay in registers: through memory, each head's adds waited on the previous
    // head's stores (a fifth of the kernel's time with 64 heads).
    hn::Vec<decltype(dd)> head_sum[kTile / dlanes];
    for (auto& v : head_sum) v = hn::Zero(dd);
    if (vnni) x86::indexer_tile_dots_vnni(tile_codes, tile_scales, head_dim, q_codes, q_scale, q_offset, n_heads, vnni_dots);
    for (size_t h = 0; h < n_heads; ++h) {
      if (vnni) {
        std::memcpy(dot, vnni_dots + h * kTile, sizeof(dot));
      } else {
        TileHeadDots(tile_codes, tile_scales, blocks, q_codes + h * head_dim, q_scale + h * blocks, q_offset + h * blocks,
                     dot);
      }
      const float* qh = q + h * head_dim;
      if (!(widest * q_ratio[h] <= exact_ratio)) {
        for (size_t i = 0; i < valid; ++i) {
          if (!(key_ratio[i] * q_ratio[h] <= exact_ratio)) dot[i] = DotCanonical(qh, keys + (t0 + i) * head_dim, head_dim);
        }
      }
      const auto wv = hn::Set(df, w[h]);
      for (size_t v = 0; v < kTile; v += lanes) {
        const auto d = RoundBf16Finite(df, hn::Load(df, dot + v));
        const auto relu = hn::IfThenElseZero(hn::Gt(d, hn::Zero(df)), d);
        hn::Store(RoundBf16Finite(df, hn::Mul(relu, wv)), df, dot + v);
      }
      for (size_t v = 0; v < kTile / dlanes; ++v) {  // heads in order, per lane
        head_sum[v] = hn::Add(head_sum[v], hn::PromoteTo(dd, hn::Load(dfd, dot + v * dlanes)));
      }
    }
    for (size_t v = 0; v < kTile / dlanes; ++v) hn::Store(head_sum[v], dd, sum + v * dlanes);
    for (size_t i = 0; i < valid; ++i) scores[t0 + i] = round_bf16(static_cast<float>(sum[i]));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {
HWY_EXPORT(SparseAttnHeads);
HWY_EXPORT(IndexerScoresRange);
HWY_EXPORT(IndexerScoresTiles);

void sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                 const int32_t* idx, size_t n_idx, float scale, float* out, ThreadPool* pool) {
  CEDAR_CHECK(head_dim <= kSparseAttnMaxHeadDim, "sparse_attn head_dim %zu > %zu", head_dim,
              kSparseAttnMaxHeadDim);
  for (size_t i = 0; i < n_idx; ++i) {
    CEDAR_CHECK(idx[i] < 0 || static_cast<size_t>(idx[i]) < kv.rows(), "sparse_attn index %d out of %zu rows",
                idx[i], kv.rows());
  }
  const auto run = [&](size_t b, size_t e) {
    HWY_DYNAMIC_DISPATCH(SparseAttnHeads)(q, head_dim, &kv, sink, idx, n_idx, scale, out, b, e);
  };
  if (pool == nullptr || pool->size() <= 1 || n_heads < 2) {
    run(0, n_heads);
  } else {
    pool->parallel_for(n_heads, 1, [&](size_t b, size_t e, int) { run(b, e); });
  }
}

namespace {

// q's integer form for the tile kernel (IndexerScoresTiles): per block of 32, the largest power of two
// 2^L that divides every value, and the codes q / 2^L. False when a block's codes do not fit
// |c| <= 12 (q is not FP4: E2M1 codes are at most 12 when doubled) or a value is not finite; the
// caller then scores from the rows. (The ±200 check on a block's lowest bit cannot fail for finite
// floats, whose bits lie within 2^-149..2^127; it guards the ldexp below.)
bool index_query_codes(const float* q, size_t n, int8_t* codes, double* block_scale, int16_t* offset_sum,
                       double* ratio) {
  double lo_scale = INFINITY, hi_scale = 0.0;
  for (size_t b = 0; b < n / 32; ++b) {
    const float* v = q + b * 32;
    int low = INT32_MAX;
    for (size_t i = 0; i < 32; ++i) {
      if (!std::isfinite(v[i])) return false;
      if (v[i] == 0.0f) continue;
      int e = 0;
      const float m = std::frexp(v[i], &e);  // v = m · 2^e, 0.5 <= |m| < 1: 24 significant bits
      const auto mant = static_cast<uint32_t>(std::fabs(std::ldexp(m, 24)));
      low = std::min(low, e - 24 + std::countr_zero(mant));
    }
    if (low == INT32_MAX) low = 0;  // an all-zero block
    if (low < -200 || low > 200) return false;
    int sum = 0;
    for (size_t i = 0; i < 32; ++i) {
      const float c = std::ldexp(v[i], -low);  // an exact integer by the choice of low
      if (std::fabs(c) > 12.0f) return false;
      codes[b * 32 + i] = static_cast<int8_t>(c);
      sum += static_cast<int>(c);
    }
    block_scale[b] = std::ldexp(1.0, low);
    offset_sum[b] = static_cast<int16_t>(12 * sum);
    lo_scale = std::min(lo_scale, block_scale[b]);
    hi_scale = std::max(hi_scale, block_scale[b]);
  }
  *ratio = hi_scale / lo_scale;
  return true;
}

}  // namespace

void indexer_scores(const float* q, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                    size_t n_keys, float* scores, ThreadPool* pool, const uint8_t* key_spread,
                    const IndexKeyTiles* key_tiles, const uint8_t* tile_mask) {
  // The tile kernel needs finite head weights (its vector bf16 rounding has no NaN case).
  bool finite_w = true;
  for (size_t h = 0; h < n_heads; ++h) finite_w = finite_w && std::isfinite(w[h]);
  // The query's head spreads, once per query rather than per range of keys.
  constexpr size_t kMaxHeads = 256;
  // The integer tiles' query arrays (42 KB); the VNNI tile kernel takes as many heads.
  constexpr size_t kMaxTileHeads = x86::kIndexerTileMaxHeads, kMaxDim = 256;
  int q_spread[kMaxHeads];
  if (n_heads > kMaxHeads) key_spread = nullptr;  // more heads than the array: every dot in float64
  if (key_spread != nullptr)
    for (size_t h = 0; h < n_heads; ++h) q_spread[h] = exact_sum_spread(q + h * head_dim, head_dim);
  // The integer tiles need q in FP4 form, whole blocks of 32 and room in the arrays below.
  alignas(32) int8_t q_codes[kMaxTileHeads * kMaxDim];
  double q_scale[kMaxTileHeads * kMaxDim / 32];
  int16_t q_offset[kMaxTileHeads * kMaxDim / 32];
  double q_ratio[kMaxTileHeads];
  bool tiled = key_tiles != nullptr && finite_w && head_dim % 32 == 0 && head_dim <= kMaxDim && n_heads <= kMaxTileHeads;
  for (size_t h = 0; tiled && h < n_heads; ++h)
    tiled = index_query_codes(q + h * head_dim, head_dim, q_codes + h * head_dim, q_scale + h * (head_dim / 32),
                              q_offset + h * (head_dim / 32), q_ratio + h);
  const auto run_all = [&](size_t b, size_t e) {
    if (tiled) {
      HWY_DYNAMIC_DISPATCH(IndexerScoresTiles)(q, q_codes, q_scale, q_offset, q_ratio, w, n_heads, head_dim, keys,
                                               *key_tiles, scores, b, e);
    } else {
      HWY_DYNAMIC_DISPATCH(IndexerScoresRange)(q, w, n_heads, head_dim, keys, key_spread, q_spread, scores, b, e);
    }
  };
  // With a tile mask, each run of flagged tiles in [b, e) is scored (b is a tile boundary).
  const auto run = [&](size_t b, size_t e) {
    if (tile_mask == nullptr) {
      run_all(b, e);
      return;
    }
    for (size_t t = b; t < e;) {
      if (!tile_mask[t / kIndexKeyTile]) {
        t += kIndexKeyTile;
        continue;
      }
      size_t end = t;
      while (end < e && tile_mask[end / kIndexKeyTile]) end = std::min(e, end + kIndexKeyTile);
      run_all(t, end);
      t = end;
    }
  };
  if (pool == nullptr || pool->size() <= 1 || n_keys < 256) {
    run(0, n_keys);
  } else {
    pool->parallel_for(n_keys, 64, [&](size_t b, size_t e, int) { run(b, e); });  // 64: whole tiles
  }
}

uint8_t exact_sum_spread_fp4(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n) {
  // E2M1 magnitude codes 1..7 are 0.5, 1, 1.5, 2, 3, 4, 6: their top-bit and lowest-bit exponents.
  static constexpr int kTop[8] = {0, -1, 0, 0, 1, 1, 2, 2};
  static constexpr int kLow[8] = {0, -1, 0, -1, 1, 0, 2, 1};
  int top = INT32_MIN, low = INT32_MAX;
  for (size_t b = 0; b < n / 32; ++b) {
    unsigned present = 0;  // bit m: magnitude code m occurs in the block
    for (size_t i = 0; i < 16; ++i) {
      const uint8_t byte = packed[b * 16 + i];
      present |= (1u << (byte & 7)) | (1u << ((byte >> 4) & 7));
    }
    if (scales_e8m0[b] == 0xFF) return kNoExactSpread;  // a NaN scale makes even zero codes NaN
    present &= ~1u;                                     // zeros do not count
    if (present == 0) continue;
    const int e = static_cast<int>(scales_e8m0[b]) - 127;
    for (int m = 1; m < 8; ++m) {
      if (!(present & (1u << m))) continue;
      top = std::max(top, e + kTop[m]);
      low = std::min(low, e + kLow[m]);
    }
  }
  if (top == INT32_MIN) return 0;
  if (top > 60 || low < -60) return kNoExactSpread;
  return static_cast<uint8_t>(std::min(top - low, 254));
}

void append_index_key_tile(const uint8_t* packed, const uint8_t* scales_e8m0, size_t head_dim, size_t t,
                           uint8_t* codes, double* scales) {
  static constexpr int8_t kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const size_t lane = t % kIndexKeyTile;
  uint8_t* tile = codes + (t / kIndexKeyTile) * head_dim * kIndexKeyTile;
  for (size_t k = 0; k < head_dim; ++k) {
    const int code = kTwice[(packed[k / 2] >> (4 * (k & 1))) & 0xF];
    tile[((k / 4) * kIndexKeyTile + lane) * 4 + (k & 3)] = static_cast<uint8_t>(code + 12);
  }
  double* tile_scales = scales + (t / kIndexKeyTile) * (head_dim / 32) * kIndexKeyTile;
  for (size_t b = 0; b < head_dim / 32; ++b) {
    // 2^(e - 127) / 2 for the doubled codes. A NaN scale sends the key to the row dot: E8M0 255 is
    // NaN, and at 2^126 and 2^127 the key's fp32 row (what the contract multiplies) overflows to inf
    // for codes of 4 and up, or 2 and up, which a float64 scale would not reproduce.
    tile_scales[b * kIndexKeyTile + lane] =
        scales_e8m0[b] >= 253 ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, scales_e8m0[b] - 128);
  }
}

uint8_t exact_sum_spread(const float* v, size_t n) {
  int top = INT32_MIN, low = INT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint32_t exp_field = (bits >> 23) & 0xFF, mant = bits & 0x7FFFFF;
    if (exp_field == 0xFF) return kNoExactSpread;
    if (exp_field == 0 && mant == 0) continue;  // zero
    // value = sig · 2^(e - 23) with sig the 24-bit significand (subnormals: exponent field 1, no
    // implicit bit).
    const int e = exp_field == 0 ? -126 : static_cast<int>(exp_field) - 127;
    const uint32_t sig = exp_field == 0 ? mant : (mant | 0x800000u);
    int msb = 23;
    while (!(sig >> msb)) --msb;
    top = std::max(top, e - 23 + msb);
    low = std::min(low, e - 23 + std::countr_zero(sig));
  }
  if (top == INT32_MIN) return 0;
  // Far from 1 the bound would also need the products to stay clear of fp32 underflow and overflow;
  // such rows simply take the float64 dot.
  if (top > 60 || low < -60) return kNoExactSpread;
  return static_cast<uint8_t>(std::min(top - low, 254));
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
