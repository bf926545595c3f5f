// The x86 forms inside the fast linear kernels (ops/linear/x86_fp4_gemv.h, x86_fp8_gemv.h, x86_gemm_bf16.h)
// against their scalar references and the format tables: the FP4 GEMV's VNNI byte planes and bf16
// activation rows, the prefill GEMM's FP4 / FP8 panels as bf16 pairs, and the inputs the FP8 bf16 GEMV
// must decline. Each runs where the CPU has the instructions and skips elsewhere.
#include "ops/linear/linear_fast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/linear/x86_fp4_gemv.h"
#include "ops/linear/x86_fp8_gemv.h"
#include "ops/linear/x86_gemm_bf16.h"
#include "ops/simd/x86_features.h"
#include "ops_test_util.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// The AVX512-VNNI kernel's byte planes: the vector packer writes the scalar reference's bytes and
// corrections, for plane values across their whole range and every block position in a row.
TEST(Fp4VnniPlanes, PackedBlocksEqualTheScalarPacker) {
  Rng rng(12);
  UniformInt<int32_t> value(-30720, 30720);
  const size_t kblocks = 19, padded = x86::fp4_vnni_padded_blocks(kblocks);
  std::vector<int8_t> want_plane(padded * 64), got_plane(padded * 64);
  std::vector<int32_t> want_corr(padded), got_corr(padded);
  for (int round = 0; round < 50; ++round) {
    for (size_t kb = 0; kb < kblocks; ++kb) {
      int32_t p[32];
      for (int32_t& v : p) v = value(rng);
      if (round == 0) p[kb % 32] = kb % 2 ? 30720 : -30720;  // the extremes
      if (round == 1) std::fill(p, p + 32, static_cast<int32_t>(kb % 2 ? 127 : -128));  // byte edges
      x86::fp4_vnni_pack_block_scalar(p, kb, want_plane.data(), want_corr.data());
      x86::fp4_vnni_pack_block(p, kb, got_plane.data(), got_corr.data());
    }
    ASSERT_EQ(got_plane, want_plane) << "round " << round;
    ASSERT_EQ(got_corr, want_corr) << "round " << round;
  }
}

// The bf16 form's activation layout: the vector packer writes the scalar reference's words, for
// widths with a short last group too, and both decline a nonzero value below 2^-125 or one that is not
// a bf16 number. The reference itself is checked against the layout's definition.
TEST(Fp4Bf16Plane, PackedRowsEqualTheScalarPacker) {
  Rng rng(14);
  UniformInt<int> code(0, 255), exponent(-20, 20);
  for (size_t k : {32, 96, 128, 160, 416, 5120}) {
    const size_t words = x86::fp4_bf16_plane_words(k);
    ASSERT_EQ(words % 128, 0u);
    ASSERT_GE(words, k);
    std::vector<float> v(k);
    for (auto& x : v) x = code(rng) % 7 == 0 ? 0.0f : std::ldexp(e4m3_to_f32(static_cast<uint8_t>(code(rng) & 0xFE)), exponent(rng));
    std::vector<uint16_t> want(words, 0xDEAD), got(words, 0xBEEF);
    ASSERT_TRUE(x86::fp4_bf16_pack_row_scalar(v.data(), k, want.data())) << k;
    ASSERT_TRUE(x86::fp4_bf16_pack_row(v.data(), k, got.data())) << k;
    ASSERT_EQ(got, want) << "k " << k;
    for (size_t j = 0; j < k; ++j) {
      const size_t g = j / 128, b = (j / 32) % 4, e = j % 32;
      ASSERT_EQ(bf16_bits_to_f32(want[g * 128 + (e % 4) * 32 + 8 * b + e / 4]), v[j]) << "k " << k << " @" << j;
    }
    for (size_t j = k; j < words; ++j) {
      const size_t g = j / 128, b = (j / 32) % 4, e = j % 32;
      ASSERT_EQ(want[g * 128 + (e % 4) * 32 + 8 * b + e / 4], 0) << "padding @" << j;
    }
    for (const float bad : {0x1p-126f, -0x1.8p-127f, 1.0f + 0x1p-10f}) {
      std::vector<float> w(v);
      w[k / 2] = bad;
      EXPECT_FALSE(x86::fp4_bf16_pack_row_scalar(w.data(), k, want.data())) << bad;
      EXPECT_FALSE(x86::fp4_bf16_pack_row(w.data(), k, got.data())) << bad;
    }
    std::vector<float> w(v);
    w[k - 1] = -0x1p-125f;  // the smallest magnitude taken
    EXPECT_TRUE(x86::fp4_bf16_pack_row(w.data(), k, got.data()));
  }
}

// Checks a bf16-pair panel (x86_gemm_bf16.h: panel[(16 * b + i) * 16 + r] holds pair i of row r's
// block b) against the decoded values: want(r, b, i) gives the pair's two f32 values, computed from the
// format tables. Rows nr..15 must be zero.
template <typename Want>
void expect_panel_holds(const std::vector<uint32_t>& panel, size_t blocks, size_t nr, const Want& want) {
  for (size_t b = 0; b < blocks; ++b)
    for (size_t i = 0; i < 16; ++i)
      for (size_t r = 0; r < 16; ++r) {
        const uint32_t got = panel[(16 * b + i) * 16 + r];
        if (r >= nr) {
          ASSERT_EQ(got, 0u) << "nr " << nr << " row " << r;
          continue;
        }
        const auto [even, odd] = want(r, b, i);
        ASSERT_EQ(got & 0xFFFF, f32_to_bf16_bits(even)) << "row " << r << " block " << b << " pair " << i;
        ASSERT_EQ(got >> 16, f32_to_bf16_bits(odd)) << "row " << r << " block " << b << " pair " << i;
        // The values themselves (the bits of a bf16 number are its value's top half).
        ASSERT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(got & 0xFFFF)), even);
        ASSERT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(got >> 16)), odd);
      }
}

TEST(LinearFast, Fp4PanelsAsBf16PairsEqualTheDecodedValues) {
  // The prefill GEMM's direct FP4 -> bf16-pair panels (x86_gemm_bf16.h): 16 rows x 16 blocks in
  // which every row holds every byte value, at scales from the extremes the decode takes to 2^0,
  // full and short panels, against e2m1_table x e8m0_table; and the scales it must refuse.
  if (!x86::gemm_bf16_usable()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const size_t rows = 16, blocks = 16, row_bytes = blocks * 16;
  const int kScales[] = {2, 60, 126, 127, 128, 200, 252};
  std::vector<uint8_t> packed(rows * row_bytes), scales(rows * blocks);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < row_bytes; ++j) packed[r * row_bytes + j] = static_cast<uint8_t>(j + 17 * r);
    for (size_t b = 0; b < blocks; ++b) scales[r * blocks + b] = static_cast<uint8_t>(kScales[(r + 3 * b) % 7]);
  }
  for (size_t nr : {size_t{16}, size_t{5}, size_t{1}}) {
    std::vector<uint32_t> panel(blocks * 16 * 16, 0xDEADBEEF);
    int lo = 255, hi = 0;
    ASSERT_TRUE(x86::fp4_panel_bf16_pairs(packed.data(), row_bytes, scales.data(), blocks, nr, blocks, panel.data(),
                                          &lo, &hi));
    int s_lo = 255, s_hi = 0;
    for (size_t r = 0; r < nr; ++r)
      for (size_t b = 0; b < blocks; ++b) {
        s_lo = std::min<int>(s_lo, scales[r * blocks + b]);
        s_hi = std::max<int>(s_hi, scales[r * blocks + b]);
      }
    EXPECT_EQ(lo, s_lo - 1);
    EXPECT_EQ(hi, s_hi + 2);
    expect_panel_holds(panel, blocks, nr, [&](size_t r, size_t b, size_t i) {
      const uint8_t byte = packed[r * row_bytes + 16 * b + i];
      const float s = e8m0_table()[scales[r * blocks + b]];
      return std::pair{e2m1_table()[byte & 15] * s, e2m1_table()[byte >> 4] * s};
    });
  }
  for (int scale : {0, 1, 253, 254, 255}) {
    std::vector<uint8_t> bad = scales;
    bad[7 * blocks + 9] = static_cast<uint8_t>(scale);
    std::vector<uint32_t> panel(blocks * 16 * 16);
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp4_panel_bf16_pairs(packed.data(), row_bytes, bad.data(), blocks, 16, blocks, panel.data(), &lo,
                                           &hi))
        << scale;
  }
}

TEST(LinearFast, Fp8PanelsAsBf16PairsEqualTheDecodedValues) {
  // The prefill GEMM's direct FP8 -> bf16-pair panels (x86_gemm_bf16.h, AVX512-VBMI): 16 rows of 9
  // blocks (an odd count: the last block alone) in which every row holds every non-NaN code, at
  // scales from the extremes the decode takes to 2^0, full and short panels, against e4m3_table x
  // e8m0_table; and the scales and NaN codes it must refuse.
  if (!x86::gemm_bf16_usable() || !x86::has_avx512_bf16_vbmi()) GTEST_SKIP() << "no AVX512-BF16 + VBMI";
  const size_t rows = 16, blocks = 9, k = 32 * blocks;
  const int kScales[] = {10, 60, 127, 200, 246};
  std::vector<uint8_t> codes(rows * k), scales(blocks);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < k; ++j) {
      const uint8_t c = static_cast<uint8_t>(j + 37 * r);
      codes[r * k + j] = (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c - 1) : c;  // NaN codes: their neighbours
    }
  for (size_t b = 0; b < blocks; ++b) scales[b] = static_cast<uint8_t>(kScales[b % 5]);
  for (size_t nr : {size_t{16}, size_t{7}, size_t{1}}) {
    std::vector<uint32_t> panel(blocks * 16 * 16, 0xDEADBEEF);
    int lo = 255, hi = 0;
    ASSERT_TRUE(x86::fp8_panel_bf16_pairs(codes.data(), k, scales.data(), nr, blocks, panel.data(), &lo, &hi));
    EXPECT_EQ(lo, 10 - 9);
    EXPECT_EQ(hi, 246 + 8);
    expect_panel_holds(panel, blocks, nr, [&](size_t r, size_t b, size_t i) {
      const float s = e8m0_table()[scales[b]];
      const uint8_t* pair = codes.data() + r * k + 32 * b + 2 * i;
      return std::pair{e4m3_table()[pair[0]] * s, e4m3_table()[pair[1]] * s};
    });
  }
  std::vector<uint32_t> panel(blocks * 16 * 16);
  for (int scale : {0, 9, 247, 255}) {
    std::vector<uint8_t> bad = scales;
    bad[4] = static_cast<uint8_t>(scale);
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp8_panel_bf16_pairs(codes.data(), k, bad.data(), 16, blocks, panel.data(), &lo, &hi)) << scale;
  }
  for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    std::vector<uint8_t> bad = codes;
    bad[5 * k + 200] = nan;
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp8_panel_bf16_pairs(bad.data(), k, scales.data(), 16, blocks, panel.data(), &lo, &hi));
  }
}

TEST(LinearFast, Fp8GemvBf16DeclinesActivationsItCannotTakeExactly) {
  if (!x86::fp8_gemv_bf16_usable()) GTEST_SKIP() << "this CPU lacks AVX512-VBMI or AVX512-BF16";
  // Three 32-row groups; the middle one's weight scale (2^-125) scales the activations below 2^-117,
  // where vdpbf16ps would flush products: the kernel must stop there and leave the group to the caller.
  Rng rng(31);
  const size_t n = 96, k = 128;
  const BlockWeights w = [&] {
    BlockWeights b = random_block_weights(false, n, k, rng);
    for (size_t kb = 0; kb < k / 32; ++kb) b.scales[1 * (k / 32) + kb] = 2;
    return b;
  }();
  const auto x = random_bf16(k, rng, 2.0f);
  std::vector<float> scratch(fast::act_scratch_floats(1, k));
  const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), 1, k, scratch));
  std::vector<float> y(n, -1.0f);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 0, n), 32u);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 40, n), 40u);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), n);
  EXPECT_EQ(y[40], -1.0f) << "a declined group is left untouched";
  // Scaled activations of 256 and above: times 2^120 they would pass bf16's largest number (2^128 less
  // a 256th), so the arithmetic decode's activations could not hold them. With scale 1, 300 is declined
  // and 255 (whose 2^120 multiple is bf16's largest) is taken.
  {
    BlockWeights unit = w;
    std::fill(unit.scales.begin(), unit.scales.end(), uint8_t{127});
    std::vector<float> act(a.values, a.values + k);
    act[3] = 300.0f;
    EXPECT_EQ(x86::fp8_gemv_bf16(act.data(), 1, unit.data.data(), unit.scales.data(), n, k, y.data(), 0, n), 0u);
    act[3] = 255.0f;
    EXPECT_EQ(x86::fp8_gemv_bf16(act.data(), 1, unit.data.data(), unit.scales.data(), n, k, y.data(), 0, n), n);
  }
  // Non-finite activations: every group is declined (the caller's kernel propagates them).
  {
    std::vector<float> nan_x(a.values, a.values + k);
    nan_x[70] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(x86::fp8_gemv_bf16(nan_x.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), 64u);
    nan_x[70] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(x86::fp8_gemv_bf16(nan_x.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), 64u);
  }
  // Activations that are not bf16 values (wo_a reads x unquantised) are declined from the start.
  std::vector<float> not_bf16(x);
  not_bf16[5] = std::nextafter(not_bf16[5], 100.0f);
  EXPECT_EQ(x86::fp8_gemv_bf16(not_bf16.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 0, n), 0u);
  // Through the public entry, the declined rows come out exactly as the Highway kernel computes them.
  std::vector<float> with(n), without(n);
  fast::linear_fp8(x.data(), 1, w.fp8(), with.data(), scratch, nullptr);
  x86::set_fp8_gemv_bf16_allowed(false);
  fast::linear_fp8(x.data(), 1, w.fp8(), without.data(), scratch, nullptr);
  x86::set_fp8_gemv_bf16_allowed(true);
  for (size_t i = 32; i < 64; ++i) ASSERT_EQ(std::memcmp(&with[i], &without[i], 4), 0) << "row " << i;
}

}  // namespace
}  // namespace cedar::ops
