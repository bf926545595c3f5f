// Image spans through the engine (GenerationRequest::images): the chunked prefill plans its pieces
// around a span (the reference prefills a span in one chunk), and a request with images neither
// restores nor saves a prefix, so a different image behind the same token ids never hits.
#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "ops/sample/sample.h"
#include "runtime/local_engine.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

using model::testing::golden_span;
using model::testing::vision_checkpoint;

constexpr int kPatch = 14;

// BOS, one text id, a 4x4-patch image (2x2 tokens: 8 positions) at position 2, two text ids.
std::vector<int32_t> prompt_with_image(const model::SequenceImages& images) {
  std::vector<int32_t> ids = {0, 1000};
  ids.insert(ids.end(), images.spans[0].types.size(), 129264);
  ids.push_back(2000);
  ids.push_back(3000);
  return ids;
}

std::shared_ptr<model::SequenceImages> one_image(int salt) {
  auto im = std::make_shared<model::SequenceImages>();
  im->spans.push_back(golden_span(2, 4, 4, salt, kPatch));
  return im;
}

EngineOptions exact_options(bool prefix_cache, int prefill_chunk) {
  EngineOptions o;
  o.threads = 1;
  o.numerics = ops::Numerics::kExact;
  o.prefix_cache = prefix_cache;
  o.prefill_chunk = prefill_chunk;
  return o;
}

// Greedy ids of `prompt` run on the model directly, prefilled in the given pieces.
std::vector<int32_t> direct_greedy(const std::vector<int32_t>& prompt, model::SequenceImages& images,
                                   const std::vector<size_t>& pieces, int n) {
  model::ModelOptions mo;
  mo.numerics = ops::Numerics::kExact;
  auto m = model::Model::load(vision_checkpoint(1), mo);
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return {};
  ThreadPool pool(1);
  model::SequenceState seq = (*m)->new_sequence(static_cast<int64_t>(prompt.size()) + n + 1);
  std::vector<float> logits((*m)->config().vocab_size);
  size_t at = 0;
  for (size_t len : pieces) {
    model::SeqChunk c{&seq, std::span<const int32_t>(prompt).subspan(at, len), &images};
    EXPECT_TRUE((*m)->forward({&c, 1}, logits.data(), &pool).ok());
    at += len;
  }
  EXPECT_EQ(at, prompt.size());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(ops::argmax(logits.data(), (*m)->sampleable_vocab()));
    if (i + 1 == n) break;
    model::SeqChunk c{&seq, std::span<const int32_t>(&out.back(), 1), nullptr};
    EXPECT_TRUE((*m)->forward({&c, 1}, logits.data(), &pool).ok());
  }
  return out;
}

GenerationRequest image_request(std::shared_ptr<model::SequenceImages> images, int n) {
  GenerationRequest r;
  r.prompt_ids = prompt_with_image(*images);
  r.images = std::move(images);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  return r;
}

// Chunks of 3: [0, 2) stops before the span, [2, 10) takes the whole span past the budget,
// [10, 12) the rest. The engine's ids equal the model run on exactly those pieces.
TEST(ImageEngine, ChunkedPrefillPlansItsPiecesAroundASpan) {
  auto engine = make_engine(vision_checkpoint(1), exact_options(false, 3));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto images = one_image(1);
  auto out = generate(**engine, image_request(images, 4));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  auto fresh = one_image(1);
  EXPECT_EQ(out->output_ids, direct_greedy(prompt_with_image(*fresh), *fresh, {2, 8, 2}, 4));
}

// A request whose span does not hold the image token, or a model without a tower, is refused at
// submit() (a bad request never fails the running batch).
TEST(ImageEngine, BadSpansAreRefusedAtSubmit) {
  auto engine = make_engine(vision_checkpoint(1), exact_options(false, 0));
  ASSERT_TRUE(engine.ok());
  GenerationRequest r = image_request(one_image(1), 2);
  r.prompt_ids[5] = 7;
  auto out = generate(**engine, r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("not the image token"), std::string::npos) << out.status().message();

  auto text_only = make_engine(model::testing::tiny_checkpoint(1), exact_options(false, 0));
  ASSERT_TRUE(text_only.ok());
  out = generate(**text_only, image_request(one_image(1), 2));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("no vision tower"), std::string::npos) << out.status().message();
}

// With the prefix cache on: the same ids with another image after a finished request restore
// nothing and give what a fresh engine gives; neither does a text request with those ids.
TEST(ImageEngine, RequestsWithImagesBypassThePrefixCache) {
  auto engine = make_engine(vision_checkpoint(1), exact_options(true, 0));
  ASSERT_TRUE(engine.ok());
  auto first = generate(**engine, image_request(one_image(1), 3));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto second = generate(**engine, image_request(one_image(2), 3));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->cached_tokens, 0);
  auto fresh_engine = make_engine(vision_checkpoint(1), exact_options(false, 0));
  ASSERT_TRUE(fresh_engine.ok());
  auto fresh = generate(**fresh_engine, image_request(one_image(2), 3));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(second->output_ids, fresh->output_ids);
  GenerationRequest text = image_request(one_image(1), 2);
  text.images.reset();
  auto t = generate(**engine, text);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->cached_tokens, 0);
}

}  // namespace
}  // namespace cedar::runtime
