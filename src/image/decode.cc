#include "image/decode.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "image/decode_internal.h"

namespace cedar::image {

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kGif: return "GIF";
    case ImageFormat::kUnknown: break;
  }
  return "unknown format";
}

ImageFormat sniff_image_format(std::span<const uint8_t> bytes) {
  auto starts_with = [&](size_t at, const char* magic) {
    const size_t n = std::strlen(magic);
    return bytes.size() >= at + n && std::memcmp(bytes.data() + at, magic, n) == 0;
  };
  if (starts_with(0, "\x89PNG\r\n\x1a\n")) return ImageFormat::kPng;
  if (starts_with(0, "\xff\xd8\xff")) return ImageFormat::kJpeg;
  if (starts_with(0, "RIFF") && starts_with(8, "WEBP")) return ImageFormat::kWebp;
  if (starts_with(0, "GIF87a") || starts_with(0, "GIF89a")) return ImageFormat::kGif;
  return ImageFormat::kUnknown;
}

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return invalid_argument("image '" + std::string(name) + "': " + std::to_string(bytes.size()) +
                            " bytes exceed the limit of " + std::to_string(limits.max_bytes) +
                            " bytes per image; send a smaller (downscaled or recompressed) image");
  }
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kPng: return internal::decode_png(bytes, name, limits);
    case ImageFormat::kJpeg: return internal::decode_jpeg(bytes, name, limits);
    case ImageFormat::kWebp: return internal::decode_webp(bytes, name, limits);
    case ImageFormat::kGif: return internal::decode_gif(bytes, name, limits);
    case ImageFormat::kUnknown: break;
  }
  std::string head;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%s%02x", i ? " " : "", bytes[i]);
    head += hex;
  }
  return invalid_argument("image '" + std::string(name) + "': not a PNG, JPEG, WebP or GIF file (" +
                          (bytes.empty() ? std::string("it is empty") : "first bytes " + head) +
                          "); send the image in one of these formats");
}

namespace internal {

Status check_dimensions(int64_t width, int64_t height, std::string_view name, ImageFormat format,
                        const ImageLimits& limits) {
  const std::string who = "image '" + std::string(name) + "': the " + image_format_name(format);
  if (width <= 0 || height <= 0) {
    return invalid_argument(who + " declares an empty canvas (" + std::to_string(width) + "x" + std::to_string(height) +
                            "); send an image with at least one pixel");
  }
  if (width > limits.max_side || height > limits.max_side) {
    return invalid_argument(who + " is " + std::to_string(width) + "x" + std::to_string(height) +
                            " pixels, over the limit of " + std::to_string(limits.max_side) +
                            " pixels a side; downscale it before sending");
  }
  if (width * height > limits.max_pixels) {
    return invalid_argument(who + " is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                            std::to_string(width * height) + " pixels, over the limit of " +
                            std::to_string(limits.max_pixels) + " pixels (a decompression bomb?); downscale it " +
                            "before sending");
  }
  return Status::ok_status();
}

Status corrupt_image(std::string_view name, ImageFormat format, std::string_view detail) {
  return invalid_argument("image '" + std::string(name) + "': the " + image_format_name(format) +
                          " is truncated or corrupt (" + std::string(detail) + "); send a complete PNG, JPEG, " +
                          "WebP or GIF file");
}

RgbImage make_rgb_image(int width, int height) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.assign(static_cast<size_t>(width) * height * 3, 0);
  return image;
}

}  // namespace internal
}  // namespace cedar::image
