#include "image/processor.h"

#include <cmath>
#include <cstring>
#include <string>

#include "image/decode.h"
#include "image/resample.h"
#include "ops/formats/formats.h"

namespace cedar::image {
namespace {

constexpr uint8_t kPadGrey = 127;  // load_image: color=(127, 127, 127)

// Python's math.ceil / math.floor of a float, and round() (half to even: nearbyint in the default mode).
int64_t py_ceil(double x) { return static_cast<int64_t>(std::ceil(x)); }
int64_t py_floor(double x) { return static_cast<int64_t>(std::floor(x)); }
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// llm_grid: ceil((best // patch) / downsample) per side.
void llm_grid(int64_t best_height, int64_t best_width, const ProcessorConfig& c, int64_t* n_h, int64_t* n_w) {
  *n_h = py_ceil(static_cast<double>(best_height / c.patch_size) / c.downsample);
  *n_w = py_ceil(static_cast<double>(best_width / c.patch_size) / c.downsample);
}

int64_t tokens_of(int64_t n_h, int64_t n_w) { return n_h * (n_w + 1) + 2; }

// solve_resize_ratio: the largest aspect-preserving size whose token grid fits max_n_token.
void solve_resize_ratio(double height, double width, const ProcessorConfig& c, int64_t* best_h, int64_t* best_w) {
  const double r = height / width;
  const double max_w_float = std::sqrt((c.max_n_token - 2) / r + 0.25) - 0.5;
  const double max_h_float = max_w_float * r;
  const int64_t cell = int64_t{c.patch_size} * c.downsample;
  if (max_w_float < 1.0) {  // very tall: one column
    *best_h = (c.max_n_token - 2) / 2 * cell;
    *best_w = cell;
    return;
  }
  if (max_h_float < 1.0) {  // very wide: one row
    *best_h = cell;
    *best_w = int64_t{c.max_n_token - 3} * cell;
    return;
  }
  const double beta = std::min(static_cast<double>(py_floor(max_w_float) * cell) / width,
                               static_cast<double>(py_floor(max_h_float) * cell) / height);
  *best_h = py_floor(height * beta / c.patch_size) * c.patch_size;
  *best_w = py_floor(width * beta / c.patch_size) * c.patch_size;
}

void paste(const RgbImage& tile, int x0, int y0, RgbImage* canvas) {
  for (int y = 0; y < tile.height; ++y) {
    std::memcpy(canvas->rgb.data() + (static_cast<size_t>(y + y0) * canvas->width + x0) * 3, tile.pixel(0, y),
                static_cast<size_t>(tile.width) * 3);
  }
}

}  // namespace

int num_image_tokens(int n_llm_h, int n_llm_w) { return n_llm_h * (n_llm_w + 1) + 2; }

std::vector<ImageTokenType> image_token_types(int n_llm_h, int n_llm_w) {
  std::vector<ImageTokenType> types;
  types.reserve(static_cast<size_t>(num_image_tokens(n_llm_h, n_llm_w)));
  types.push_back(ImageTokenType::kStart);
  for (int row = 0; row < n_llm_h; ++row) {
    types.insert(types.end(), static_cast<size_t>(n_llm_w), ImageTokenType::kImage);
    types.push_back(ImageTokenType::kNewLine);
  }
  types.push_back(ImageTokenType::kEnd);
  return types;
}

Result<ImagePlan> plan_image_grid(int width_in, int height_in, const ProcessorConfig& c) {
  if (c.patch_size <= 0 || c.downsample <= 0 || c.max_n_token < 4 || c.min_pixels < 0) {
    return invalid_argument(
        "vision processor: patch_size, downsample must be positive and max_n_token at least 4 (got " +
        std::to_string(c.patch_size) + ", " + std::to_string(c.downsample) + ", " + std::to_string(c.max_n_token) +
        ")");
  }
  // Python keeps ints exact; doubles hold these sizes (< 2^53) exactly, and turn float where it does.
  double width = width_in, height = height_in;
  if (c.max_wh_ratio && width > height * *c.max_wh_ratio) width = height * *c.max_wh_ratio;
  if (0 < width * height && width * height < static_cast<double>(c.min_pixels)) {
    const double ratio = std::pow(static_cast<double>(c.min_pixels) / (width * height), 0.5);
    width = static_cast<double>(static_cast<int64_t>(width * ratio));
    height = static_cast<double>(static_cast<int64_t>(height * ratio));
  }
  int64_t best_w = py_ceil(width / c.patch_size) * c.patch_size;
  int64_t best_h = py_ceil(height / c.patch_size) * c.patch_size;
  // safe_resize
  int64_t n_h = 0, n_w = 0;
  llm_grid(best_h, best_w, c, &n_h, &n_w);
  if (tokens_of(n_h, n_w) > c.max_n_token) {
    solve_resize_ratio(height, width, c, &best_h, &best_w);
    llm_grid(best_h, best_w, c, &n_h, &n_w);
  }
  if (tokens_of(n_h, n_w) > c.max_n_token || best_h <= 0 || best_w <= 0) {
    return invalid_argument("image of " + std::to_string(width_in) + "x" + std::to_string(height_in) +
                            " pixels: no patch grid fits " + std::to_string(c.max_n_token) + " image tokens");
  }
  ImagePlan plan;
  plan.n_llm_h = static_cast<int>(n_h);
  plan.n_llm_w = static_cast<int>(n_w);
  plan.best_height = static_cast<int>(best_h);
  plan.best_width = static_cast<int>(best_w);
  return plan;
}

RgbImage pad_to_size(const RgbImage& image, int width, int height) {
  // ImageOps.contain: keep the aspect ratio inside (width, height); the side that does not fill is
  // round()ed as Python does (half to even).
  int new_w = width, new_h = height;
  const double im_ratio = static_cast<double>(image.width) / image.height;
  const double dest_ratio = static_cast<double>(width) / height;
  if (im_ratio != dest_ratio) {
    if (im_ratio > dest_ratio) {
      new_h = static_cast<int>(py_round(static_cast<double>(image.height) / image.width * width));
    } else {
      new_w = static_cast<int>(py_round(static_cast<double>(image.width) / image.height * height));
    }
  }
  RgbImage canvas;
  canvas.width = width;
  canvas.height = height;
  canvas.rgb.assign(static_cast<size_t>(width) * height * 3, kPadGrey);
  if (new_w == 0 || new_h == 0) return canvas;  // contain() gives an empty image: all padding
  const RgbImage resized = resize_bicubic(image, new_w, new_h);
  if (new_w == width && new_h == height) return resized;
  // ImageOps.pad: centring (0.5, 0.5), the offset round()ed.
  if (new_w != width) {
    paste(resized, static_cast<int>(py_round((width - new_w) * 0.5)), 0, &canvas);
  } else {
    paste(resized, 0, static_cast<int>(py_round((height - new_h) * 0.5)), &canvas);
  }
  return canvas;
}

Result<ProcessedImage> process_image(const RgbImage& image, const ProcessorConfig& c) {
  CEDAR_ASSIGN_OR_RETURN(ImagePlan plan, plan_image_grid(image.width, image.height, c));
  ProcessedImage out;
  out.plan = plan;
  const int p = c.patch_size;
  out.n_vit_h = plan.best_height / p;
  out.n_vit_w = plan.best_width / p;
  if (c.max_wh_ratio && image.width >= *c.max_wh_ratio * image.height) {
    out.canvas = resize_bicubic(image, plan.best_width, plan.best_height);
  } else {
    out.canvas = pad_to_size(image, plan.best_width, plan.best_height);
  }
  // (x / 255 - 0.5) / 0.5 in float32, then bf16 (round to nearest even), as torch does it.
  uint16_t normalised[256];
  for (int v = 0; v < 256; ++v) {
    const float x = static_cast<float>(v) / 255.0f;
    normalised[v] = ops::f32_to_bf16_bits((x - 0.5f) / 0.5f);
  }
  const size_t patch_len = static_cast<size_t>(3) * p * p;
  out.patches.resize(static_cast<size_t>(out.n_vit_h) * out.n_vit_w * patch_len);
  uint16_t* dst = out.patches.data();
  for (int ph = 0; ph < out.n_vit_h; ++ph) {
    for (int pw = 0; pw < out.n_vit_w; ++pw) {
      for (int channel = 0; channel < 3; ++channel) {
        for (int r = 0; r < p; ++r) {
          const uint8_t* src = out.canvas.pixel(pw * p, ph * p + r) + channel;
          for (int s = 0; s < p; ++s) *dst++ = normalised[src[3 * s]];
        }
      }
    }
  }
  return out;
}

Result<ProcessedImage> load_image(std::span<const uint8_t> bytes, std::string_view name, const ProcessorConfig& config,
                                  const ImageLimits& limits) {
  CEDAR_ASSIGN_OR_RETURN(RgbImage rgb, decode_image(bytes, name, limits));
  return process_image(rgb, config);
}

}  // namespace cedar::image
