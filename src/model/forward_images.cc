// Image spans in the forward pass (image_spans.h): checking a chunk's spans, and the ViT + aligner
// run that gives a span its embedding rows, as inference/model.py merge_image_embeddings lays them
// out. Where the rows go in (Transformer::embed), bias_vl (Gate) and the Engram mask (Engram) are in
// transformer.cc, moe.cc and engram.cc.
#include <cstring>

#include "core/check.h"
#include "model/model.h"
#include "model/vision_aligner.h"
#include "model/vision_tower.h"
#include "ops/formats/formats.h"

namespace cedar::model {

Status Model::bind_vision() {
  if (vision_) return {};
  CEDAR_ASSIGN_OR_RETURN(auto tower, VisionTower::bind(config_, *weight_map_));
  CEDAR_ASSIGN_OR_RETURN(auto aligner, VisionAligner::bind(config_, *weight_map_));
  auto store = std::make_unique<VisionTensorStore>();
  image_start_ = store->bf16(*weight_map_, "image_start");
  image_end_ = store->bf16(*weight_map_, "image_end");
  image_newline_ = store->bf16(*weight_map_, "image_newline");
  image_vectors_store_ = std::move(store);
  aligner_ = std::move(aligner);
  vision_ = std::move(tower);
  return {};
}

// The spans a chunk reaches: well formed, in a model that reads images, with the image token at every
// span position of the chunk, and none cut by the chunk's start (a span is prefilled in one chunk, or
// in the pieces of one chunk: Model::forward_rounds).
Status Model::check_images(const SequenceImages& im, std::span<const int32_t> tokens, int64_t p0) const {
  if (im.empty()) return {};
  const int64_t p1 = p0 + static_cast<int64_t>(tokens.size());
  if (!has_vision())
    return invalid_argument("this checkpoint has no vision tower (config.json has no vision_config); it cannot "
                               "read images: send text only, or serve a checkpoint with the vision tower");
  const int p = config_.vision.patch_size, r = config_.vision.downsample;
  int64_t prev_end = 0;
  for (const ImageSpan& s : im.spans) {
    const std::string what = "image span '" + s.name + "' at position " + std::to_string(s.start);
    if (s.start < prev_end || s.types.size() < 3) return invalid_argument(what + ": spans overlap or are empty");
    prev_end = s.end();
    if (s.end() <= p0 || s.start >= p1) continue;
    if (s.start < p0 && s.end() > p0)
      return invalid_argument(what + ": the chunk starts inside the span; an image span is prefilled in one chunk");
    if (s.end() > p1)
      return invalid_argument(what + ": the chunk ends inside the span; an image span is prefilled in one chunk");
    for (int64_t q = s.start; q < s.end(); ++q)
      if (tokens[q - p0] != config_.image_token_id)
        return invalid_argument(what + ": position " + std::to_string(q) + " holds token " +
                                std::to_string(tokens[q - p0]) + ", not the image token " +
                                std::to_string(config_.image_token_id));
    if (s.n_vit_h <= 0 || s.n_vit_w <= 0 ||
        s.patches.size() != static_cast<size_t>(s.n_vit_h) * s.n_vit_w * 3 * p * p)
      return invalid_argument(what + ": the patches do not match the " + std::to_string(s.n_vit_h) + "x" +
                              std::to_string(s.n_vit_w) + " patch grid");
    // image_token_types(ceil(n_h / r), ceil(n_w / r)).
    const int gh = (s.n_vit_h + r - 1) / r, gw = (s.n_vit_w + r - 1) / r;
    bool layout = s.types.size() == static_cast<size_t>(gh) * (gw + 1) + 2 && s.types.front() == kImageStart &&
                  s.types.back() == kImageEnd;
    for (int row = 0; layout && row < gh; ++row)
      for (int col = 0; col <= gw; ++col)
        layout = layout && s.types[1 + static_cast<size_t>(row) * (gw + 1) + col] ==
                               (col == gw ? kImageNewLine : kImageToken);
    if (!layout)
      return invalid_argument(what + ": its token types are not image_token_types(" + std::to_string(gh) + ", " +
                              std::to_string(gw) + ") of its patch grid");
  }
  return {};
}

Status Model::encode_image_spans(SequenceImages& im, int64_t from, int64_t to, ThreadPool* pool) {
  im.embeddings.resize(im.spans.size());
  const size_t dim = config_.dim;
  for (size_t i = 0; i < im.spans.size(); ++i) {
    const ImageSpan& s = im.spans[i];
    if (s.end() <= from || s.start >= to || !im.embeddings[i].empty()) continue;
    CEDAR_RETURN_IF_ERROR(bind_vision());
    const std::vector<float> patches_out = vision_->forward(s.patches, s.n_vit_h, s.n_vit_w, kernels(), pool);
    const std::vector<float> rows = aligner_->forward(patches_out, s.n_vit_h, s.n_vit_w, kernels(), pool);
    std::vector<float>& out = im.embeddings[i];
    out.resize(s.types.size() * dim);
    size_t next_row = 0;  // IMAGE slots take the aligner's rows in reading order
    for (size_t t = 0; t < s.types.size(); ++t) {
      float* dst = out.data() + t * dim;
      switch (s.types[t]) {
        case kImageStart: ops::bf16_to_f32(image_start_, dst, dim); break;
        case kImageEnd: ops::bf16_to_f32(image_end_, dst, dim); break;
        case kImageNewLine: ops::bf16_to_f32(image_newline_, dst, dim); break;
        default:
          CEDAR_CHECK((next_row + 1) * dim <= rows.size(), "image span: more IMAGE slots than aligner rows");
          std::memcpy(dst, rows.data() + next_row * dim, dim * sizeof(float));
          ++next_row;
      }
    }
    CEDAR_CHECK(next_row * dim == rows.size(), "image span: fewer IMAGE slots than aligner rows");
  }
  return {};
}

}  // namespace cedar::model
