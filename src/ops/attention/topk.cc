// topk_ascending (attention.h): the indexer's and the pool's top-k, the same selection in both numerics
// modes. Index scores are bf16 values, so a radix select on 16-bit order keys finds the k-th key T in
// two counting passes; one pass in index order then takes every key above T and the first keys equal
// to T (lower index wins ties), which is also the ascending output order. Any other score takes the
// general selection (nth_element), which is also the reference the radix path must equal.
//
// The key pass and the taking pass are Highway kernels (a long prompt's prefill runs one top-k per
// query and indexer layer over every visible compressed entry: 21 % of a 64K-token prefill when they
// were scalar). The histograms stay scalar, counted in four interleaved copies so that consecutive
// keys in one bucket do not wait for each other's increments.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "ops/attention/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/topk.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// keys[i] = the order-preserving 16-bit key of scores[i]: the contract's order (NaN above everything,
// -0 == +0) as unsigned integer order. Returns false when a score is no bf16 value (low bits set) and
// not NaN: then the keys are not used.
bool TopkKeys(const float* scores, size_t n, int32_t* keys) {
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const size_t N = hn::Lanes(du);
  const auto sign = hn::Set(du, 0x80000000u);
  const auto exp_mask = hn::Set(du, 0x7F800000u);
  const auto low16 = hn::Set(du, 0xFFFFu);
  const auto nan_key = hn::Set(du, 0xFFFFu);
  auto not_bf16 = hn::Zero(du);
  const auto key_of = [&](hn::Vec<decltype(du)> u) {
    const auto nan = hn::Gt(hn::AndNot(sign, u), exp_mask);
    not_bf16 = hn::Or(not_bf16, hn::IfThenZeroElse(nan, hn::And(u, low16)));
    u = hn::IfThenZeroElse(hn::Eq(u, sign), u);  // -0 ranks with +0
    const auto negative = hn::Ne(hn::And(u, sign), hn::Zero(du));
    const auto ordered = hn::IfThenElse(negative, hn::Not(u), hn::Or(u, sign));
    return hn::BitCast(di, hn::IfThenElse(nan, nan_key, hn::ShiftRight<16>(ordered)));
  };
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(scores);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(key_of(hn::LoadU(du, bits + i)), di, keys + i);
  for (; i < n; ++i) {
    uint32_t u = bits[i];
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    if (!nan && (u & 0xFFFFu) != 0) return false;
    u = u == 0x80000000u ? 0u : u;
    const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    keys[i] = nan ? 0xFFFF : static_cast<int32_t>(ordered >> 16);
  }
  return hn::AllTrue(du, hn::Eq(not_bf16, hn::Zero(du)));
}

// out_idx[0, k) = the indices i in ascending order with keys[i] > threshold, and the first
// `equal_left` with keys[i] == threshold (their number is k).
void TopkTake(const int32_t* keys, size_t n, int32_t threshold, size_t equal_left, int32_t* out_idx, size_t k) {
  const hn::ScalableTag<int32_t> di;
  const size_t N = hn::Lanes(di);
  const auto t = hn::Set(di, threshold);
  size_t j = 0, i = 0;
  const auto take_one = [&](size_t at) {
    const int32_t v = keys[at];
    if (v > threshold || (v == threshold && equal_left > 0)) {
      if (v == threshold) --equal_left;
      out_idx[j++] = static_cast<int32_t>(at);
    }
  };
  for (; i + N <= n && j < k; i += N) {
    const auto key = hn::LoadU(di, keys + i);
    const auto above = hn::Gt(key, t);
    const auto equal = hn::Eq(key, t);
    const size_t n_equal = hn::CountTrue(di, equal);
    if (n_equal <= equal_left) {
      equal_left -= n_equal;
      const auto take = hn::Or(above, equal);
      // Most vectors take nothing (k is a small part of n).
      if (!hn::AllFalse(di, take))
        j += hn::CompressBlendedStore(hn::Iota(di, static_cast<int32_t>(i)), take, di, out_idx + j);
      continue;
    }
    for (size_t l = 0; l < N; ++l) take_one(i + l);  // the vector holding the last taken ties
  }
  for (; i < n && j < k; ++i) take_one(i);
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(TopkKeys);
HWY_EXPORT(TopkTake);

namespace {

// The general top-k: nth_element on indices with the contract's order.
void topk_by_selection(const float* scores, size_t n, size_t k, int32_t* out_idx, int32_t* scratch) {
  for (size_t i = 0; i < n; ++i) scratch[i] = static_cast<int32_t>(i);
  // Strict weak order: NaN first, then larger score first, then lower index first.
  const auto before = [scores](int32_t a, int32_t b) {
    const float va = scores[a];
    const float vb = scores[b];
    const bool na = std::isnan(va);
    const bool nb = std::isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  if (k < n) std::nth_element(scratch, scratch + (k - 1), scratch + n, before);
  std::copy_n(scratch, k, out_idx);
  std::sort(out_idx, out_idx + k);
}

// Bucket b of a histogram counted in four copies.
uint32_t bucket(const uint32_t (&h)[4][256], int b) { return h[0][b] + h[1][b] + h[2][b] + h[3][b]; }

}  // namespace

void topk_ascending(const float* scores, size_t n, size_t k, int32_t* out_idx, int32_t* scratch) {
  CEDAR_CHECK(k <= n, "topk: k %zu > n %zu", k, n);
  if (k == 0) return;
  if (!HWY_DYNAMIC_DISPATCH(TopkKeys)(scores, n, scratch)) return topk_by_selection(scores, n, k, out_idx, scratch);
  uint32_t hist[4][256] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (size_t c = 0; c < 4; ++c) ++hist[c][scratch[i + c] >> 8];
  for (; i < n; ++i) ++hist[0][scratch[i] >> 8];
  size_t above = 0;  // keys in buckets above the current one
  int hi = 255;
  while (above + bucket(hist, hi) < k) above += bucket(hist, hi--);
  uint32_t low_hist[4][256] = {};
  for (i = 0; i + 4 <= n; i += 4)
    for (size_t c = 0; c < 4; ++c) low_hist[c][scratch[i + c] & 0xFF] += (scratch[i + c] >> 8) == hi;
  for (; i < n; ++i) low_hist[0][scratch[i] & 0xFF] += (scratch[i] >> 8) == hi;
  int lo = 255;
  while (above + bucket(low_hist, lo) < k) above += bucket(low_hist, lo--);
  // k - above keys equal to the threshold are taken.
  HWY_DYNAMIC_DISPATCH(TopkTake)(scratch, n, (hi << 8) | lo, k - above, out_idx, k);
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
