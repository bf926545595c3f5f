// Shared by the per-format decoders (decode_png.cc, decode_jpeg.cc, decode_webp.cc, decode_gif.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "image/image_types.h"

namespace cedar::image::internal {

// The canvas size a header declares, against the limits: the one check between a header and the
// allocation of its pixels.
Status check_dimensions(int64_t width, int64_t height, std::string_view name, ImageFormat format,
                        const ImageLimits& limits);

// "image 'NAME': the PNG is truncated or corrupt (DETAIL); send a complete PNG, JPEG, WebP or GIF file".
Status corrupt_image(std::string_view name, ImageFormat format, std::string_view detail);

// An empty image of this size with its pixel buffer allocated.
RgbImage make_rgb_image(int width, int height);

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits);
Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits);
Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits);
Result<RgbImage> decode_gif(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits);

}  // namespace cedar::image::internal
