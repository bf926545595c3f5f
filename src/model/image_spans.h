// Image spans of one sequence, as inference/image_processor.py prepare_vl_inputs lays them out and
// inference/model.py Transformer.forward consumes them: every position of a span carries
// image_token_id in the token ids; the span's token types tell IMAGE_START, IMAGE, IMAGE_NEW_LINE
// and IMAGE_END apart (TEXT, -1, everywhere else). At span positions the forward pass
//   * replaces the embedding: IMAGE slots take the aligner's rows in reading order, the delimiters
//     the learned image_start / image_newline / image_end vectors (merge_image_embeddings);
//   * routes with the gates' bias_vl instead of bias (image_mask = token_types >= 0);
//   * gives no Engram contribution, and no n-gram reaches across the span (the position is DEAD in
//     the hash history, so look-backs stop there as at the start of the sequence).
// The compressor and the indexer treat image positions as any other (the reference has no image
// case there).
//
// The caller (the engine) owns one SequenceImages per sequence for the life of its prefill; the
// model fills `embeddings` the first time a forward reaches a span (ViT + aligner once per span,
// however the prompt is cut into chunks) and reads the rows from there.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cedar::model {

// image_processor.py's constants (TEXT = -1 is no span position).
inline constexpr int8_t kImageStart = 0, kImageToken = 1, kImageNewLine = 2, kImageEnd = 3;

struct ImageSpan {
  int64_t start = 0;            // position of IMAGE_START in the sequence
  std::vector<int8_t> types;    // image_token_types(n_llm_h, n_llm_w): the span is types.size() long
  int n_vit_h = 0, n_vit_w = 0;  // the ViT patch grid
  std::vector<uint16_t> patches;  // bf16 bits [n_vit_h * n_vit_w, 3 * patch * patch] (image/processor.h)
  // SHA-256 of the image's encoded bytes: what a prefix cache keys an image span by (an identical
  // image may hit, a different one never does). Filled by whoever decoded the image.
  std::array<uint8_t, 32> content_sha256{};
  std::string name;  // how errors name the image ("image 1", a file name)

  int64_t end() const { return start + static_cast<int64_t>(types.size()); }
  bool contains(int64_t pos) const { return pos >= start && pos < end(); }
};

struct SequenceImages {
  std::vector<ImageSpan> spans;  // ascending, non-overlapping
  // [span][types.size() * dim] bf16-valued floats: the merged embedding rows of each span, computed
  // on first use by Model (empty until then).
  std::vector<std::vector<float>> embeddings;

  bool empty() const { return spans.empty(); }
  // The span holding `pos`, or -1.
  int span_at(int64_t pos) const {
    for (size_t i = 0; i < spans.size(); ++i)
      if (spans[i].contains(pos)) return static_cast<int>(i);
    return -1;
  }
};

// Prefix-cache keys of image positions. Every position of a span carries the same token id, so a
// cache keyed by ids alone would serve one image's KV for another. The KV home therefore records, at
// an image position, a key id instead: a negative number (never a vocabulary id) derived from the
// image's SHA-256, its patch grid and the offset in the span (XXH3-64, 31 bits per position). Every
// level of the prefix cache (memory, disk, tails, the shared tier) compares ids, so an identical image
// at the same place hits and any other image misses at its span's first position; a span of L
// positions carries 31 * L bits of the image's identity.
int32_t image_key_id(const ImageSpan& span, int64_t pos);
// `ids` (the sequence's ids from position p0) with every image-span position replaced by its key id.
void key_image_positions(const SequenceImages& images, int64_t p0, std::span<int32_t> ids);

}  // namespace cedar::model
