// Prefix-cache key ids of image-span positions (image_spans.h).
#include <algorithm>
#include <cstring>

#include <xxhash.h>

#include "model/image_spans.h"

namespace cedar::model {

int32_t image_key_id(const ImageSpan& span, int64_t pos) {
  // sha256 | n_vit_h | n_vit_w | offset: the same bytes at another grid (another --max-image-tokens)
  // are another span.
  uint8_t key[32 + 3 * sizeof(int64_t)];
  const int64_t fields[3] = {span.n_vit_h, span.n_vit_w, pos - span.start};
  std::memcpy(key, span.content_sha256.data(), 32);
  std::memcpy(key + 32, fields, sizeof(fields));
  const uint64_t h = XXH3_64bits(key, sizeof(key));
  return static_cast<int32_t>(-1 - static_cast<int64_t>(h & 0x7fffffffu));
}

void key_image_positions(const SequenceImages& images, int64_t p0, std::span<int32_t> ids) {
  const int64_t p1 = p0 + static_cast<int64_t>(ids.size());
  for (const ImageSpan& s : images.spans)
    for (int64_t q = std::max(s.start, p0); q < std::min(s.end(), p1); ++q) ids[q - p0] = image_key_id(s, q);
}

}  // namespace cedar::model
