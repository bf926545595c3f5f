// The official image processor (inference/image_processor.py): an RGB image becomes a grid of 14x14
// patches for the ViT (bf16, (x/255 - 0.5)/0.5, channel-major inside a patch) and a span of token types
// for the LLM. Sizes follow plan_image_grid / safe_resize / solve_resize_ratio to the floating-point
// operation; the resize and padding are Pillow's (ImageOps.pad with its default bicubic filter, grey
// 127, centred as Pillow rounds the offset), pixel for pixel.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "image/image_types.h"

namespace cedar::image {

// vision_config of the release (config.json): patch 14, downsample 3, 1024 image tokens at most,
// min_pixels 295936 (544 x 544), max_wh_ratio null.
struct ProcessorConfig {
  int patch_size = 14;
  int downsample = 3;
  int max_n_token = 1024;
  int64_t min_pixels = 295936;
  std::optional<double> max_wh_ratio;  // null in the release: every image is padded, none stretched
};

// plan_image_grid's answer: the pixel size the image is brought to and the LLM token grid.
struct ImagePlan {
  int n_llm_h = 0, n_llm_w = 0;
  int best_height = 0, best_width = 0;  // multiples of patch_size
};

// image_processor.py's IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END (TEXT is -1 there).
enum class ImageTokenType : int8_t { kStart = 0, kImage = 1, kNewLine = 2, kEnd = 3 };

struct ProcessedImage {
  ImagePlan plan;
  int n_vit_h = 0, n_vit_w = 0;
  RgbImage canvas;                // best_width x best_height, the pixels the patches are cut from
  std::vector<uint16_t> patches;  // bf16 bits, [n_vit_h * n_vit_w][3 * patch * patch], reading order
};

// n_llm_h rows of (n_llm_w IMAGE + one IMAGE_NEW_LINE), between IMAGE_START and IMAGE_END.
int num_image_tokens(int n_llm_h, int n_llm_w);
std::vector<ImageTokenType> image_token_types(int n_llm_h, int n_llm_w);

// A pure function of the original size. Fails only where the reference's assertion would (a plan
// over max_n_token) or the config is unusable.
Result<ImagePlan> plan_image_grid(int width, int height, const ProcessorConfig& config);

// ImageOps.pad(image, (width, height), color=(127, 127, 127)): Pillow's contain() + centred paste.
RgbImage pad_to_size(const RgbImage& image, int width, int height);

// load_image after the decode: plan, pad (or stretch when max_wh_ratio says so), normalise, cut.
Result<ProcessedImage> process_image(const RgbImage& image, const ProcessorConfig& config);

// decode_image + process_image.
Result<ProcessedImage> load_image(std::span<const uint8_t> bytes, std::string_view name, const ProcessorConfig& config,
                                  const ImageLimits& limits = {});

}  // namespace cedar::image
