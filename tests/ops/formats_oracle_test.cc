// Replays tests/ops/data/formats_oracle.txt, written by tools/oracles/formats_oracle.py with pinned
// ml_dtypes / numpy (an implementation of the formats independent of cedar's).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ops/formats/formats.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h

std::vector<uint32_t> read_hex_fields(std::istringstream& in) {
  std::vector<uint32_t> out;
  std::string tok;
  while (in >> tok && tok != "|") out.push_back(static_cast<uint32_t>(std::stoul(tok, nullptr, 16)));
  return out;
}

TEST(FormatsOracle, AgreesWithMlDtypes) {
  const std::string path = std::string(CEDAR_SOURCE_DIR) + "/tests/ops/data/formats_oracle.txt";
  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << "missing " << path << " (run tools/oracles/formats_oracle.py)";
  std::string line;
  size_t n_cvt = 0, n_e8m0 = 0, n_blocks = 0;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "cvt") {
      std::vector<uint32_t> f = read_hex_fields(in);
      ASSERT_EQ(f.size(), 5u) << line;
      const float x = from_bits(f[0]);
      EXPECT_EQ(f32_to_bf16_bits(x), f[1]) << line;
      EXPECT_EQ(f32_to_f16_bits(x), f[2]) << line;
      EXPECT_EQ(f32_to_e4m3(x), f[3]) << line;
      EXPECT_EQ(f32_to_e2m1(x), f[4]) << line;
      ++n_cvt;
    } else if (kind == "e8m0") {
      std::vector<uint32_t> f = read_hex_fields(in);
      ASSERT_EQ(f.size(), 2u);
      EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(f[0])), from_bits(f[1])) << line;
      ++n_e8m0;
    } else {
      std::vector<uint32_t> xs = read_hex_fields(in);
      std::vector<uint32_t> codes = read_hex_fields(in);
      std::vector<uint32_t> scale = read_hex_fields(in);
      ASSERT_EQ(xs.size(), codes.size());
      ASSERT_EQ(scale.size(), 1u);
      std::vector<float> x(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) x[i] = from_bits(xs[i]);
      const size_t n = x.size();
      std::vector<uint8_t> got_codes(n), packed(n / 2);
      uint8_t got_scale = 0;
      if (kind == "fp8") {
        act_quant_fp8(x.data(), n, got_codes.data(), &got_scale);
      } else if (kind == "fp4e8m0") {
        fp4_quant_e8m0(x.data(), n, packed.data(), &got_scale, n);
        unpack_fp4_codes(packed.data(), n, got_codes.data());
      } else if (kind == "fp4e4m3") {
        fp4_quant_e4m3(x.data(), n, packed.data(), &got_scale, n);
        unpack_fp4_codes(packed.data(), n, got_codes.data());
      } else {
        FAIL() << "unknown record " << kind;
      }
      EXPECT_EQ(got_scale, scale[0]) << kind << ": " << line.substr(0, 80);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(got_codes[i], codes[i]) << kind << " element " << i;
      ++n_blocks;
    }
  }
  EXPECT_GT(n_cvt, 4000u);
  EXPECT_EQ(n_e8m0, 255u);
  EXPECT_EQ(n_blocks, 180u);
}

}  // namespace
}  // namespace cedar::ops
