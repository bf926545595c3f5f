#include "image/resample.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace cedar::image {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Resample.c: 8 result bits, 2 for overshoot, sign
constexpr double kBicubicSupport = 2.0;

// Resample.c bicubic_filter (Keys' cubic with a = -0.5), evaluated in the same order.
double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One output coordinate's taps: source range [first, first + count) and fixed-point weights.
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // out_size x ksize
};

// Resample.c precompute_coeffs (box = the whole source) followed by normalize_coeffs_8bpc.
Taps precompute_taps(int in_size, int out_size) {
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);  // the box is float in Pillow
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kBicubicSupport * filterscale;
  Taps taps;
  taps.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.ksize, 0);
  std::vector<double> k(taps.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic_filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    for (int x = 0; x < xmax; ++x) {
      const double scaled = k[x] * (1 << kPrecisionBits);
      taps.weights[static_cast<size_t>(xx) * taps.ksize + x] =
          static_cast<int32_t>(k[x] < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    taps.first[xx] = xmin;
    taps.count[xx] = xmax;
  }
  return taps;
}

// Resample.c clip8: the sum carries a rounding half; an arithmetic shift floors, then clamp.
inline uint8_t clip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Horizontal pass over `rows` rows of `source` starting at `row_first`, `taps` wide.
RgbImage horizontal_pass(const RgbImage& source, int row_first, int rows, const Taps& taps, int width) {
  constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);
  RgbImage out;
  out.width = width;
  out.height = rows;
  out.rgb.resize(static_cast<size_t>(width) * rows * 3);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in_row = source.pixel(0, y + row_first);
    uint8_t* dst = out.rgb.data() + static_cast<size_t>(y) * width * 3;
    for (int xx = 0; xx < width; ++xx, dst += 3) {
      const int32_t* k = &taps.weights[static_cast<size_t>(xx) * taps.ksize];
      const uint8_t* in = in_row + static_cast<size_t>(taps.first[xx]) * 3;
      int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
      for (int x = 0; x < taps.count[xx]; ++x) {
        s0 += in[3 * x] * k[x];
        s1 += in[3 * x + 1] * k[x];
        s2 += in[3 * x + 2] * k[x];
      }
      dst[0] = clip8(s0), dst[1] = clip8(s1), dst[2] = clip8(s2);
    }
  }
  return out;
}

// Vertical pass; `row_offset` is the source row of `source`'s row 0 (the horizontal pass may have kept
// only the rows the taps read).
RgbImage vertical_pass(const RgbImage& source, int row_offset, const Taps& taps, int height) {
  constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);
  RgbImage out;
  out.width = source.width;
  out.height = height;
  out.rgb.resize(static_cast<size_t>(out.width) * height * 3);
  const size_t stride = static_cast<size_t>(source.width) * 3;
  for (int yy = 0; yy < height; ++yy) {
    const int32_t* k = &taps.weights[static_cast<size_t>(yy) * taps.ksize];
    const uint8_t* in_col = source.rgb.data() + static_cast<size_t>(taps.first[yy] - row_offset) * stride;
    uint8_t* dst = out.rgb.data() + static_cast<size_t>(yy) * stride;
    for (size_t c = 0; c < stride; ++c) {
      int32_t s = kHalf;
      for (int y = 0; y < taps.count[yy]; ++y) s += in_col[static_cast<size_t>(y) * stride + c] * k[y];
      dst[c] = clip8(s);
    }
  }
  return out;
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& source, int width, int height) {
  CEDAR_CHECK(width >= 1 && height >= 1 && source.width >= 1 && source.height >= 1, "resize_bicubic: empty size");
  if (width == source.width && height == source.height) return source;
  const bool need_horizontal = width != source.width;
  const bool need_vertical = height != source.height;
  const Taps vertical = precompute_taps(source.height, height);
  // Pillow 13 (python-pillow PR 9549) runs the vertical pass first when the height shrinks by more than
  // twice as many pixels as the width does; the order changes the 8-bit intermediate, so it is kept.
  const bool vertical_first =
      height < source.height && (source.height - height) > 2 * (static_cast<int64_t>(source.width) - width);
  if (vertical_first) {
    RgbImage stage = vertical_pass(source, 0, vertical, height);
    if (!need_horizontal) return stage;
    return horizontal_pass(stage, 0, height, precompute_taps(source.width, width), width);
  }
  if (!need_horizontal) return vertical_pass(source, 0, vertical, height);
  // Only the source rows some output row reads go through the horizontal pass (Resample.c's ybox).
  const int row_first = vertical.first[0];
  const int row_last = vertical.first[height - 1] + vertical.count[height - 1];
  RgbImage stage =
      horizontal_pass(source, row_first, row_last - row_first, precompute_taps(source.width, width), width);
  if (!need_vertical) return stage;
  return vertical_pass(stage, row_first, vertical, height);
}

}  // namespace cedar::image
