// Decoding an encoded image (PNG, JPEG, WebP, GIF's first frame) to 8-bit RGB the way Pillow's
// `Image.open(...).convert("RGB")` does it in the official processor (inference/image_processor.py,
// load_image): grey is replicated, alpha is dropped (not composited), palettes are looked up, 16-bit
// colour keeps the high byte and 16-bit grey is clipped to 255 (Pillow's I;16 -> RGB). The decoders
// are the Debian libraries (libpng, libjpeg-turbo, libwebp, giflib); cedar has no codec of its own.
//
// Every failure is a Status naming the image (`name`), the format and the limit or defect: bytes over
// `limits.max_bytes`, a declared canvas over `limits.max_pixels` (checked from the header, before pixel
// memory is allocated), a truncated or corrupt file, or bytes of no supported format.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/status.h"
#include "image/image_types.h"

namespace cedar::image {

// The format the leading bytes announce (kUnknown when none matches).
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits = {});

}  // namespace cedar::image
