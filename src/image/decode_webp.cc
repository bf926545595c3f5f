// WebP through libwebp's animation decoder, as Pillow's WebPImagePlugin reads every WebP (still or
// animated): the first frame on its canvas, non-premultiplied RGBA, alpha then dropped.
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>
#include <memory>
#include <string>

#include "image/decode_internal.h"

namespace cedar::image::internal {
namespace {

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* decoder) const { WebPAnimDecoderDelete(decoder); }
};

}  // namespace

Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits) {
  // The header's canvas size first: the decoder allocates width x height x 4 bytes up front.
  WebPBitstreamFeatures features;
  const VP8StatusCode header = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (header != VP8_STATUS_OK) {
    return corrupt_image(name, ImageFormat::kWebp,
                         header == VP8_STATUS_NOT_ENOUGH_DATA ? "the header ends early" : "its header does not parse");
  }
  CEDAR_RETURN_IF_ERROR(check_dimensions(features.width, features.height, name, ImageFormat::kWebp, limits));

  WebPData data{bytes.data(), bytes.size()};
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) return internal_error("libwebp: WebPAnimDecoderOptionsInit failed");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> decoder(WebPAnimDecoderNew(&data, &options));
  if (decoder == nullptr) return corrupt_image(name, ImageFormat::kWebp, "libwebp's demuxer refused it");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info)) {
    return corrupt_image(name, ImageFormat::kWebp, "libwebp could not read the canvas");
  }
  CEDAR_RETURN_IF_ERROR(check_dimensions(info.canvas_width, info.canvas_height, name, ImageFormat::kWebp, limits));
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &rgba, &timestamp) || rgba == nullptr) {
    return corrupt_image(name, ImageFormat::kWebp, "libwebp could not decode the first frame");
  }
  RgbImage image = make_rgb_image(static_cast<int>(info.canvas_width), static_cast<int>(info.canvas_height));
  const size_t n = static_cast<size_t>(image.width) * image.height;
  for (size_t i = 0; i < n; ++i) std::memcpy(image.rgb.data() + 3 * i, rgba + 4 * i, 3);
  return image;
}

}  // namespace cedar::image::internal
