// A bf16 weight stored losslessly in 12 bits per weight, for the fast GEMV.
//
// Why: a single-token GEMV reads each weight once, so a bf16 matrix larger than the caches (the head:
// 129,280 × 5,120 on the released model, 39 % of the small preset's bytes per token) runs at the
// memory's read bandwidth whatever the kernel does; the only way to finish sooner is to read fewer
// bytes. A bf16 number is a high byte (sign and the exponent's upper seven bits) and a low byte (the
// exponent's last bit and seven mantissa bits). In a trained or Gaussian row the high byte takes few
// values: magnitudes spread over a few binades, so 16 values cover all but ~1e-4 of the weights.
// Each row keeps a table of its 16 most frequent high bytes, and each weight a 4-bit index into it
// beside its low byte: 1.5 bytes instead of 2, decoded in registers by one byte shuffle per vector.
// A block of 128 weights with any high byte outside the table stores its 128 high bytes whole (an
// exception). The decoded bits equal the original ones, so the products are the same exact fp32
// values as the bf16 GEMV's; only the summation order is the fast kernels' own.
//
// Layout, per row of k weights (k a multiple of 64), in blocks of 128 weights of 192 bytes each:
//   bytes 0..63:    codes; byte j holds weight j's code in its low nibble and weight 64 + j's in its
//                   high nibble (an exception block's codes are zero and unused),
//   bytes 64..191:  the 128 weights' low bytes, in order;
// then, when k % 128 == 64, the last 64 weights as plain bf16 (128 bytes; small models only: the
// released model's widths are multiples of 128). Rows follow each other, so a GEMV over rows [a, b)
// reads one contiguous stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/huge_pages.h"

namespace cedar::ops {

struct Bf16Weight;

inline constexpr size_t kBf16CodedBlock = 128;       // weights per block
inline constexpr size_t kBf16CodedBlockBytes = 192;  // 64 code bytes + 128 low bytes

// Bytes of one coded row of k weights (the blocks and the plain tail).
inline size_t bf16_coded_row_bytes(size_t k) {
  return k / kBf16CodedBlock * kBf16CodedBlockBytes + (k % kBf16CodedBlock) * 2;
}
// Bytes of an [n, k] weight in this form without exception blocks (rows, tables, row offsets); each
// exception block adds 132 (its high bytes and its index).
inline size_t bf16_coded_base_bytes(size_t n, size_t k) { return n * (bf16_coded_row_bytes(k) + 16) + (n + 1) * 4; }

struct Bf16Coded {
  size_t n = 0;
  size_t k = 0;
  HugePageBytes blocks;                   // [n] rows of bf16_coded_row_bytes(k)
  std::vector<uint8_t> tables;            // [n, 16] high bytes
  std::vector<uint32_t> row_exceptions;   // [n + 1]: row r's exceptions are [row_exceptions[r], row_exceptions[r + 1])
  std::vector<uint32_t> exception_block;  // per exception: its block within the row, rising within a row
  std::vector<uint8_t> exception_high;    // per exception: the block's 128 high bytes

  size_t bytes() const { return bf16_coded_base_bytes(n, k) + exception_high.size() + 4 * exception_block.size(); }
};

// Whether code_bf16 takes a weight of this width (at least one coded block).
inline bool bf16_codable(size_t k) { return k >= kBf16CodedBlock && k % 64 == 0; }

// Re-codes w (n rows of k bf16, bf16_codable(k)); nullptr when the memory cannot be had.
std::unique_ptr<Bf16Coded> code_bf16(const Bf16Weight& w);

// The scalar reference decoder: weight (row, i)'s bf16 bits.
uint16_t bf16_coded_bits(const Bf16Coded& w, size_t row, size_t i);

namespace fast {
// Rows [n_begin, n_end) of y[r, n] = Σ_i x[r, i] · w[n, i] in fp32 (rounded to bf16 when bf16_out) for
// m activation rows of w.k floats (any m; fast::linear_bf16 sends GEMV-sized ones), y with w.n columns.
// Each output is one thread's fixed-order sum; the products are exact, so |y - exact| obeys
// linear_fast.h's bound.
void bf16_coded_gemv(const float* x, size_t m, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                     size_t n_end);
// The same in two steps, so that threads splitting the rows share one layout of the activations:
// xp [m, k] is x in the lane order of the dispatched SIMD target, then any row ranges of the GEMV.
void bf16_coded_permute(const float* x, size_t m, size_t k, float* xp);
void bf16_coded_gemv_permuted(const float* xp, size_t m, const Bf16Coded& w, float* y, bool bf16_out, size_t n_begin,
                              size_t n_end);
}  // namespace fast

}  // namespace cedar::ops
