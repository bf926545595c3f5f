// The processor's arithmetic against values worked out by hand from inference/image_processor.py
// (the pixel-level parity with Pillow is the CTest image_pillow_parity, tests/image/py).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "image/decode.h"
#include "image/processor.h"
#include "image/resample.h"

namespace cedar::image {
namespace {

RgbImage solid(int width, int height, uint8_t r, uint8_t g, uint8_t b) {
  RgbImage image;
  image.width = width;
  image.height = height;
  for (int i = 0; i < width * height; ++i) image.rgb.insert(image.rgb.end(), {r, g, b});
  return image;
}

ProcessorConfig no_upscale(int max_n_token) {
  ProcessorConfig config;
  config.max_n_token = max_n_token;
  config.min_pixels = 0;
  return config;
}

void expect_plan(const Result<ImagePlan>& plan, int n_llm_h, int n_llm_w, int best_height, int best_width) {
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->n_llm_h, n_llm_h);
  EXPECT_EQ(plan->n_llm_w, n_llm_w);
  EXPECT_EQ(plan->best_height, best_height);
  EXPECT_EQ(plan->best_width, best_width);
}

TEST(ImageTokenTypes, StartRowsWithOneNewLineEachEnd) {
  using T = ImageTokenType;
  const std::vector<T> expected = {T::kStart, T::kImage, T::kImage, T::kImage,   T::kNewLine,
                                   T::kImage, T::kImage, T::kImage, T::kNewLine, T::kEnd};
  EXPECT_EQ(image_token_types(2, 3), expected);
  EXPECT_EQ(num_image_tokens(2, 3), 10);
  EXPECT_EQ(num_image_tokens(13, 13), 13 * 14 + 2);
}

TEST(PlanImageGrid, MinPixelsSquareIsKeptAndOnePixelIsUpscaledToIt) {
  const ProcessorConfig release;  // 295936 = 544 x 544: not below min_pixels, so no upscale
  // ceil(544 / 14) = 39 patches a side, ceil(39 / 3) = 13 tokens a side.
  expect_plan(plan_image_grid(544, 544, release), 13, 13, 546, 546);
  // 1x1 is scaled by sqrt(295936) = 544 to the same size.
  expect_plan(plan_image_grid(1, 1, release), 13, 13, 546, 546);
}

TEST(PlanImageGrid, WideStripIsUpscaledThenGridded) {
  // 2000x1: ratio sqrt(295936 / 2000) = 12.164..., so 24328 x 12 -> 1738 x 1 patches -> 1 x 580 tokens.
  expect_plan(plan_image_grid(2000, 1, ProcessorConfig{}), 1, 580, 14, 24332);
}

TEST(PlanImageGrid, TokenCapCollapsesVeryTallAndVeryWideImages) {
  // 1x10000 under 64 tokens: max_w_float < 1, one column of (64 - 2) / 2 = 31 cells of 42 pixels.
  expect_plan(plan_image_grid(1, 10000, no_upscale(64)), 31, 1, 31 * 42, 42);
  // 10000x1: max_h_float < 1, one row of 64 - 3 = 61 cells.
  expect_plan(plan_image_grid(10000, 1, no_upscale(64)), 1, 61, 42, 61 * 42);
}

TEST(PlanImageGrid, RefusesAnUnusableConfig) {
  ProcessorConfig config;
  config.patch_size = 0;
  EXPECT_FALSE(plan_image_grid(100, 100, config).ok());
}

TEST(PadToSize, CentresWithPythonRoundingOfTheOffset) {
  const RgbImage image = solid(10, 5, 200, 10, 30);
  // 10x5 into 20x13: contain() gives 20x10 (a constant stays constant under the bicubic filter);
  // the offset is round(3 * 0.5) = 2 (Python rounds half to even).
  const RgbImage padded = pad_to_size(image, 20, 13);
  ASSERT_EQ(padded.width, 20);
  ASSERT_EQ(padded.height, 13);
  for (int y = 0; y < 13; ++y) {
    const bool inside = y >= 2 && y < 12;
    const uint8_t* p = padded.pixel(7, y);
    EXPECT_EQ(p[0], inside ? 200 : 127) << "row " << y;
    EXPECT_EQ(p[1], inside ? 10 : 127) << "row " << y;
  }
  // 20x11: offset round(1 * 0.5) = round(0.5) = 0, so the single grey row is at the bottom.
  const RgbImage bottom = pad_to_size(image, 20, 11);
  EXPECT_EQ(bottom.pixel(0, 0)[0], 200);
  EXPECT_EQ(bottom.pixel(0, 10)[0], 127);
}

TEST(Resample, SameSizeIsACopyAndAConstantStaysConstant) {
  const RgbImage image = solid(37, 23, 3, 250, 128);
  EXPECT_EQ(resize_bicubic(image, 37, 23).rgb, image.rgb);
  const RgbImage down = resize_bicubic(image, 11, 40);
  ASSERT_EQ(down.rgb.size(), size_t{11 * 40 * 3});
  for (size_t i = 0; i < down.rgb.size(); i += 3) {
    ASSERT_EQ(down.rgb[i], 3);
    ASSERT_EQ(down.rgb[i + 1], 250);
    ASSERT_EQ(down.rgb[i + 2], 128);
  }
}

TEST(ProcessImage, NormalisesToBf16ChannelMajorPatchesInReadingOrder) {
  // 28x14: two patches; the left one magenta (255, 0, 255), the right one grey 127.
  RgbImage image = solid(28, 14, 127, 127, 127);
  for (int y = 0; y < 14; ++y) {
    for (int x = 0; x < 14; ++x) {
      uint8_t* p = image.rgb.data() + (static_cast<size_t>(y) * 28 + x) * 3;
      p[0] = 255, p[1] = 0, p[2] = 255;
    }
  }
  auto processed = process_image(image, no_upscale(1024));
  ASSERT_TRUE(processed.ok()) << processed.status().to_string();
  ASSERT_EQ(processed->n_vit_h, 1);
  ASSERT_EQ(processed->n_vit_w, 2);
  ASSERT_EQ(processed->patches.size(), size_t{2 * 588});
  // (255/255 - 0.5)/0.5 = 1 -> 0x3F80; 0 -> -1 -> 0xBF80; 127: -0.00392157 = -1.0039216 * 2^-8, past the
  // halfway 1.00390625 between bf16 neighbours, so it rounds to -(1 + 1/128) * 2^-8 -> 0xBB81.
  for (int i = 0; i < 588; ++i) {
    const uint16_t expected = (i / 196 == 1) ? 0xBF80 : 0x3F80;
    ASSERT_EQ(processed->patches[i], expected) << "left patch, feature " << i;
    ASSERT_EQ(processed->patches[588 + i], 0xBB81) << "right patch, feature " << i;
  }
}

TEST(DecodeImage, RefusesWrongMagicEmptyAndOversizedInputByName) {
  const std::string html = "<html>";
  const std::vector<uint8_t> not_image(html.begin(), html.end());
  auto wrong = decode_image(not_image, "shot.png");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("'shot.png'"), std::string::npos);
  EXPECT_NE(wrong.status().message().find("3c 68 74 6d"), std::string::npos);
  EXPECT_FALSE(decode_image({}, "empty").ok());
  ImageLimits limits;
  limits.max_bytes = 4;
  const std::vector<uint8_t> png_magic = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto big = decode_image(png_magic, "big.png", limits);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("limit of 4 bytes"), std::string::npos);
  auto truncated = decode_image(png_magic, "cut.png");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated or corrupt"), std::string::npos);
  EXPECT_EQ(sniff_image_format(png_magic), ImageFormat::kPng);
}

}  // namespace
}  // namespace cedar::image
