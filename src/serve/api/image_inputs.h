// Images of a request into the model's input, as the official prepare_vl_inputs does it
// (inference/image_processor.py): every <｜deepseek_image｜> placeholder id of the prompt (image_token_id
// in config.json) takes the next image, which is decoded (image/decode.h), planned, padded and cut into
// patches (image/processor.h), and the placeholder becomes the image's span: IMAGE_START, rows of IMAGE
// each closed by IMAGE_NEW_LINE, IMAGE_END, every position carrying image_token_id.
//
// Every refusal is an InvalidArgument (a 400) naming the image and the limit or defect.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "image/image_types.h"
#include "spec/config.h"
#include "model/image_spans.h"

namespace cedar::serve {

// What a request may carry (the server's flags; the defaults are the CLI's).
struct ImageInputLimits {
  image::ImageLimits decode;     // encoded bytes, decoded pixels, sides (decompression bombs)
  int max_images = 16;           // images per request (0: none)
  int64_t max_image_tokens = 0;  // image-span positions per request (0: only the context bounds them)
};

// One image as a request carries it: its name in errors ("image 2", a file name) and its encoded bytes.
struct EncodedImage {
  std::string name;
  std::vector<uint8_t> bytes;
};

// A `data:` URL's bytes. Only base64 data URLs are taken; any other URL (http, https, file) is
// refused, as the server fetches nothing on a client's behalf.
Result<std::vector<uint8_t>> image_url_bytes(std::string_view url, std::string_view name);
// Standard base64 (RFC 4648, padding optional, no whitespace inside); an error names `what`.
Result<std::vector<uint8_t>> decode_base64(std::string_view text, std::string_view what);

// Expands `ids` in place (placeholders to spans) and returns the spans with their patches and the
// SHA-256 of each image's bytes. The placeholder count must equal images.size(). No images and no
// placeholders: returns null and leaves `ids` alone.
// image_token_id and vision: the model's (config.json); a vision config that is not present refuses
// every image.
Result<std::shared_ptr<model::SequenceImages>> expand_image_placeholders(std::vector<int32_t>& ids,
                                                                         std::span<const EncodedImage> images,
                                                                         int32_t image_token_id,
                                                                         const model::VisionConfig& vision,
                                                                         const ImageInputLimits& limits);

}  // namespace cedar::serve
