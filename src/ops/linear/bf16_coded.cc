// The 12-bit bf16 coding of bf16_coded.h: the coder and scalar decoder, and the GEMV as a Highway
// kernel for every enabled target.
#include "ops/linear/bf16_coded.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/simd/prefetch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear/bf16_coded.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// The kernel meets a block's weights V bytes at a time (V = the vector's bytes: 16, 32 or 64): code
// bytes [c, c + V) give the high bytes of weights c.. and 64 + c.., each half is interleaved with its
// low bytes within 128-bit lanes into bf16 words, and each word vector yields its even and its odd
// words as floats. So one V-byte step of a half produces four float vectors (lower even, lower odd,
// upper even, upper odd), lane 4j + i holding weight 16j + 8·(q / 2) + 2i + q % 2 of the half's step
// for vector q. The activations are laid out once per GEMV call in that order (Bf16CodedPermute).
// The plain tail (k % 128 == 64) keeps its order.
HWY_INLINE void PermuteActivations(const float* x, size_t k, size_t vbytes, float* xp) {
  const size_t floats = vbytes / 4, whole = k - k % kBf16CodedBlock;
  std::memcpy(xp + whole, x + whole, (k - whole) * sizeof(float));
  for (size_t blk = 0; blk < whole; blk += kBf16CodedBlock)
    for (size_t c = 0; c < 64; c += vbytes)
      for (size_t half = 0; half < 2; ++half) {
        const float* src = x + blk + 64 * half + c;
        for (size_t q = 0; q < 4; ++q)
          for (size_t lane = 0; lane < floats; ++lane)
            *xp++ = src[16 * (lane / 4) + 8 * (q / 2) + 2 * (lane % 4) + q % 2];
      }
}

template <size_t R>
HWY_NOINLINE void CodedGemvTile(const float* xp, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                                size_t n_end) {
  const hn::ScalableTag<uint8_t> d8;
  const hn::Repartition<uint32_t, decltype(d8)> du;
  const hn::Repartition<float, decltype(d8)> df;
  using VF = hn::Vec<decltype(df)>;
  const size_t vbytes = hn::Lanes(d8), floats = hn::Lanes(df);
  const size_t k = w.k, blocks = k / kBf16CodedBlock;
  const auto nibble = hn::Set(d8, uint8_t{0x0F});
  const auto odd_mask = hn::Set(du, 0xFFFF0000u);
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = w.blocks.get() + n * bf16_coded_row_bytes(k);
    const auto table = hn::LoadDup128(d8, w.tables.data() + 16 * n);
    uint32_t exc = w.row_exceptions[n];
    const uint32_t exc_end = w.row_exceptions[n + 1];
    size_t exc_blk = exc < exc_end ? w.exception_block[exc] : blocks;
    VF acc[R][4];
    for (size_t r = 0; r < R; ++r)
      for (size_t q = 0; q < 4; ++q) acc[r][q] = hn::Zero(df);
    // One half-step: the low bytes `lo` with their high bytes `hi` against the activations at xs.
    const auto multiply = [&](decltype(nibble) lo, decltype(nibble) hi, const float* xs) HWY_ATTR {
      const auto lower = hn::BitCast(du, hn::InterleaveLower(d8, lo, hi));
      const auto upper = hn::BitCast(du, hn::InterleaveUpper(d8, lo, hi));
      const VF f[4] = {hn::BitCast(df, hn::ShiftLeft<16>(lower)), hn::BitCast(df, hn::And(lower, odd_mask)),
                       hn::BitCast(df, hn::ShiftLeft<16>(upper)), hn::BitCast(df, hn::And(upper, odd_mask))};
      for (size_t r = 0; r < R; ++r)
        for (size_t q = 0; q < 4; ++q) acc[r][q] = hn::MulAdd(hn::LoadU(df, xs + r * k + q * floats), f[q], acc[r][q]);
    };
    for (size_t blk = 0; blk < blocks; ++blk) {
      const uint8_t* b = row + blk * kBf16CodedBlockBytes;
      prefetch_weight_stream(b);
      prefetch_weight_stream(b + 64);
      prefetch_weight_stream(b + 128);
      const float* xb = xp + blk * kBf16CodedBlock;
      if (blk != exc_blk) {
        for (size_t c = 0; c < 64; c += vbytes) {
          const auto codes = hn::LoadU(d8, b + c);
          const auto hi_a = hn::TableLookupBytes(table, hn::And(codes, nibble));
          const auto hi_b = hn::TableLookupBytes(table, hn::ShiftRight<4>(codes));
          multiply(hn::LoadU(d8, b + 64 + c), hi_a, xb + 2 * c);
          multiply(hn::LoadU(d8, b + 128 + c), hi_b, xb + 2 * c + vbytes);
        }
      } else {
        const uint8_t* high = w.exception_high.data() + size_t{exc} * kBf16CodedBlock;
        for (size_t c = 0; c < 64; c += vbytes) {
          multiply(hn::LoadU(d8, b + 64 + c), hn::LoadU(d8, high + c), xb + 2 * c);
          multiply(hn::LoadU(d8, b + 128 + c), hn::LoadU(d8, high + 64 + c), xb + 2 * c + vbytes);
        }
        ++exc;
        exc_blk = exc < exc_end ? w.exception_block[exc] : blocks;
      }
    }
    const uint8_t* tail = row + blocks * kBf16CodedBlockBytes;  // plain bf16, k % 128 weights
    for (size_t r = 0; r < R; ++r) {
      const VF sum = hn::Add(hn::Add(acc[r][0], acc[r][1]), hn::Add(acc[r][2], acc[r][3]));
      float s = hn::GetLane(hn::SumOfLanes(df, sum));
      for (size_t i = blocks * kBf16CodedBlock; i < k; ++i) {
        uint16_t bits;
        std::memcpy(&bits, tail + 2 * (i - blocks * kBf16CodedBlock), 2);
        s += xp[r * k + i] * bf16_bits_to_f32(bits);
      }
      y[r * w.n + n] = bf16_out ? round_bf16(s) : s;
    }
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

// xp [m, k]: each row of x in the kernel's lane order (PermuteActivations); the scalar target reads x
// in element order.
void Bf16CodedPermute(const float* x, size_t m, size_t k, float* xp) {
#if HWY_TARGET == HWY_SCALAR
  std::memcpy(xp, x, m * k * sizeof(float));
#else
  const size_t vbytes = hn::Lanes(hn::ScalableTag<uint8_t>());
  // A step takes one vector of the 64 code bytes of a block: vectors wider than 64 bytes (SVE, RVV)
  // would need another step.
  CEDAR_CHECK(vbytes <= 64 && 64 % vbytes == 0, "bf16_coded_gemv: %zu-byte vectors", vbytes);
  for (size_t r = 0; r < m; ++r) PermuteActivations(x + r * k, k, vbytes, xp + r * k);
#endif
}

void Bf16CodedGemvPermuted(const float* xp, size_t m, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                           size_t n_end) {
#if HWY_TARGET == HWY_SCALAR
  for (size_t n = n_begin; n < n_end; ++n)
    for (size_t r = 0; r < m; ++r) {
      float s = 0.0f;
      for (size_t i = 0; i < w.k; ++i) s += xp[r * w.k + i] * bf16_bits_to_f32(bf16_coded_bits(w, n, i));
      y[r * w.n + n] = bf16_out ? round_bf16(s) : s;
    }
#else
  switch (m) {
    case 0: break;
    case 1: CodedGemvTile<1>(xp, w, y, bf16_out, n_begin, n_end); break;
    case 2: CodedGemvTile<2>(xp, w, y, bf16_out, n_begin, n_end); break;
    case 3: CodedGemvTile<3>(xp, w, y, bf16_out, n_begin, n_end); break;
    case 4: CodedGemvTile<4>(xp, w, y, bf16_out, n_begin, n_end); break;
    default:
      // More rows: four, then the rest (each output's sum is the same either way).
      CodedGemvTile<4>(xp, w, y, bf16_out, n_begin, n_end);
      Bf16CodedGemvPermuted(xp + 4 * w.k, m - 4, w, y + 4 * w.n, bf16_out, n_begin, n_end);
      break;
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(Bf16CodedPermute);
HWY_EXPORT(Bf16CodedGemvPermuted);

std::unique_ptr<Bf16Coded> code_bf16(const Bf16Weight& w) {
  CEDAR_CHECK(bf16_codable(w.k), "code_bf16: k %zu is not a multiple of 64 from 128", w.k);
  auto c = std::make_unique<Bf16Coded>();
  c->n = w.n;
  c->k = w.k;
  const size_t blocks = w.k / kBf16CodedBlock;
  c->blocks = allocate_huge_page_bytes(w.n * bf16_coded_row_bytes(w.k));
  if (c->blocks == nullptr) return nullptr;
  c->tables.resize(w.n * 16);
  c->row_exceptions.resize(w.n + 1);
  for (size_t n = 0; n < w.n; ++n) {
    const uint16_t* src = w.bits + n * w.k;
    // The row's 16 most frequent high bytes (ties to the smaller byte, so the coding is deterministic;
    // a row of fewer distinct high bytes fills the table with bytes it does not hold). A row holds a
    // few tens of distinct high bytes, so only those are ranked.
    std::array<uint32_t, 256> count{};
    for (size_t i = 0; i < blocks * kBf16CodedBlock; ++i) ++count[src[i] >> 8];
    std::array<uint8_t, 256> order;
    size_t distinct = 0;
    for (size_t v = 0; v < 256; ++v)
      if (count[v] != 0) order[distinct++] = static_cast<uint8_t>(v);
    for (size_t v = 0; v < 256 && distinct < 16; ++v)
      if (count[v] == 0) order[distinct++] = static_cast<uint8_t>(v);
    std::partial_sort(order.begin(), order.begin() + 16, order.begin() + distinct, [&](uint8_t a, uint8_t b) {
      return count[a] != count[b] ? count[a] > count[b] : a < b;
    });
    std::array<int, 256> code;
    code.fill(-1);
    uint8_t* table = c->tables.data() + 16 * n;
    for (size_t t = 0; t < 16; ++t) {
      table[t] = order[t];
      code[order[t]] = static_cast<int>(t);
    }
    c->row_exceptions[n] = static_cast<uint32_t>(c->exception_block.size());
    uint8_t* row = c->blocks.get() + n * bf16_coded_row_bytes(w.k);
    std::memcpy(row + blocks * kBf16CodedBlockBytes, src + blocks * kBf16CodedBlock, (w.k % kBf16CodedBlock) * 2);
    for (size_t blk = 0; blk < blocks; ++blk) {
      const uint16_t* s = src + blk * kBf16CodedBlock;
      uint8_t* b = row + blk * kBf16CodedBlockBytes;
      bool coded = true;
      for (size_t j = 0; j < kBf16CodedBlock; ++j) {
        b[64 + j] = static_cast<uint8_t>(s[j] & 0xFF);
        coded = coded && code[s[j] >> 8] >= 0;
      }
      if (coded) {
        for (size_t j = 0; j < 64; ++j)
          b[j] = static_cast<uint8_t>(code[s[j] >> 8] | (code[s[64 + j] >> 8] << 4));
      } else {
        std::memset(b, 0, 64);
        c->exception_block.push_back(static_cast<uint32_t>(blk));
        for (size_t j = 0; j < kBf16CodedBlock; ++j) c->exception_high.push_back(static_cast<uint8_t>(s[j] >> 8));
      }
    }
  }
  c->row_exceptions[w.n] = static_cast<uint32_t>(c->exception_block.size());
  return c;
}

uint16_t bf16_coded_bits(const Bf16Coded& w, size_t row, size_t i) {
  const size_t blk = i / kBf16CodedBlock, j = i % kBf16CodedBlock;
  const uint8_t* b = w.blocks.get() + row * bf16_coded_row_bytes(w.k) + blk * kBf16CodedBlockBytes;
  if (blk == w.k / kBf16CodedBlock) {  // the plain tail
    uint16_t bits;
    std::memcpy(&bits, b + 2 * j, 2);
    return bits;
  }
  const uint32_t* first = w.exception_block.data() + w.row_exceptions[row];
  const uint32_t* last = w.exception_block.data() + w.row_exceptions[row + 1];
  const uint32_t* e = std::lower_bound(first, last, static_cast<uint32_t>(blk));
  uint8_t high;
  if (e != last && *e == blk) {
    high = w.exception_high[static_cast<size_t>(e - w.exception_block.data()) * kBf16CodedBlock + j];
  } else {
    const uint8_t byte = b[j % 64];
    high = w.tables[16 * row + (j < 64 ? byte & 0x0F : byte >> 4)];
  }
  return static_cast<uint16_t>(high << 8 | b[64 + j]);
}

namespace fast {
void bf16_coded_permute(const float* x, size_t m, size_t k, float* xp) {
  HWY_DYNAMIC_DISPATCH(Bf16CodedPermute)(x, m, k, xp);
}

void bf16_coded_gemv_permuted(const float* xp, size_t m, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                              size_t n_end) {
  HWY_DYNAMIC_DISPATCH(Bf16CodedGemvPermuted)(xp, m, w, y, bf16_out, n_begin, n_end);
}

void bf16_coded_gemv(const float* x, size_t m, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                     size_t n_end) {
  thread_local std::vector<float> permuted;  // [m, k], grown once per thread
  if (permuted.size() < m * w.k) permuted.resize(m * w.k);
  bf16_coded_permute(x, m, w.k, permuted.data());
  bf16_coded_gemv_permuted(permuted.data(), m, w, y, bf16_out, n_begin, n_end);
}
}  // namespace fast

}  // namespace cedar::ops
#endif  // HWY_ONCE
