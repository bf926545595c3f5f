#include "serve/api/image_inputs.h"

#include <openssl/evp.h>

#include <algorithm>

#include "image/processor.h"

namespace cedar::serve {
namespace {

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::array<uint8_t, 32> sha256(std::span<const uint8_t> bytes) {
  std::array<uint8_t, 32> digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace

Result<std::vector<uint8_t>> decode_base64(std::string_view text, std::string_view what) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return invalid_argument(std::string(what) + ": the base64 data is truncated");
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const int v = base64_value(static_cast<unsigned char>(text[i]));
    if (v < 0)
      return invalid_argument(std::string(what) + ": the base64 data has an invalid character at offset " +
                              std::to_string(i) + " (standard base64 without whitespace is expected)");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  return out;
}

Result<std::vector<uint8_t>> image_url_bytes(std::string_view url, std::string_view name) {
  const std::string who = "image '" + std::string(name) + "'";
  if (!url.starts_with("data:")) {
    if (url.starts_with("http://") || url.starts_with("https://"))
      return invalid_argument(who + ": remote image URLs are not fetched by this server; send the image inline as "
                                    "a base64 data URL (data:image/png;base64,...)");
    return invalid_argument(who + ": the URL must be a base64 data URL (data:image/png;base64,...)");
  }
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) return invalid_argument(who + ": the data URL has no ',' before its data");
  const std::string_view header = url.substr(5, comma - 5);
  if (header.find(";base64") == std::string_view::npos)
    return invalid_argument(who + ": unsupported data URL encoding '" + std::string(header) +
                            "'; only ;base64 data URLs are taken");
  return decode_base64(url.substr(comma + 1), who);
}

Result<std::shared_ptr<model::SequenceImages>> expand_image_placeholders(std::vector<int32_t>& ids,
                                                                         std::span<const EncodedImage> images,
                                                                         int32_t image_token_id,
                                                                         const model::VisionConfig& vision,
                                                                         const ImageInputLimits& limits) {
  size_t placeholders = 0;
  for (int32_t id : ids) placeholders += id == image_token_id ? 1 : 0;
  if (placeholders == 0 && images.empty()) return std::shared_ptr<model::SequenceImages>();
  if (!vision.present)
    return invalid_argument("this model's checkpoint has no vision tower, so it cannot read images: send text "
                            "only, or serve a checkpoint with the vision tower");
  if (placeholders != images.size())
    return invalid_argument("the prompt has " + std::to_string(placeholders) + " image placeholders but the request "
                            "carries " + std::to_string(images.size()) + " images");
  if (images.size() > static_cast<size_t>(std::max(0, limits.max_images)))
    return invalid_argument("the request carries " + std::to_string(images.size()) + " images, over the limit of " +
                            std::to_string(limits.max_images) + " images per request; send fewer images");
  image::ProcessorConfig pc;
  pc.patch_size = vision.patch_size;
  pc.downsample = vision.downsample;
  pc.max_n_token = vision.max_n_token;
  pc.min_pixels = vision.min_pixels;
  auto out = std::make_shared<model::SequenceImages>();
  std::vector<int32_t> expanded;
  expanded.reserve(ids.size());
  int64_t image_tokens = 0;
  size_t next = 0;
  for (int32_t id : ids) {
    if (id != image_token_id) {
      expanded.push_back(id);
      continue;
    }
    const EncodedImage& im = images[next++];
    CEDAR_ASSIGN_OR_RETURN(image::ProcessedImage p, image::load_image(im.bytes, im.name, pc, limits.decode));
    model::ImageSpan span;
    span.start = static_cast<int64_t>(expanded.size());
    for (image::ImageTokenType t : image::image_token_types(p.plan.n_llm_h, p.plan.n_llm_w))
      span.types.push_back(static_cast<int8_t>(t));
    span.n_vit_h = p.n_vit_h;
    span.n_vit_w = p.n_vit_w;
    span.patches = std::move(p.patches);
    span.content_sha256 = sha256(im.bytes);
    span.name = im.name;
    image_tokens += static_cast<int64_t>(span.types.size());
    if (limits.max_image_tokens > 0 && image_tokens > limits.max_image_tokens)
      return invalid_argument("image '" + im.name + "': the request's images take " + std::to_string(image_tokens) +
                              " tokens so far, over the limit of " + std::to_string(limits.max_image_tokens) +
                              " image tokens per request; send fewer or smaller images");
    expanded.insert(expanded.end(), span.types.size(), image_token_id);
    out->spans.push_back(std::move(span));
  }
  ids = std::move(expanded);
  return out;
}

}  // namespace cedar::serve
