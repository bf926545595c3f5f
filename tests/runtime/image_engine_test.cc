// Image spans through the engine (GenerationRequest::images): the chunked prefill plans its pieces
// around a span (the reference prefills a span in one chunk), and the prefix cache keys a span's
// positions by its image (model::image_key_id): the same image hits, another image behind the same
// token ids never does.
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

// A longer prompt for the cache: text ids, a 4x4-patch image (8 positions) at `span_at`, text ids to
// 72 tokens. With 16-token blocks the cache holds its first 64 tokens; the tiny preset's window is 16.
GenerationRequest long_image_request(int salt, int n, int64_t span_at = 34) {
  auto images = std::make_shared<model::SequenceImages>();
  images->spans.push_back(golden_span(span_at, 4, 4, salt, kPatch));
  GenerationRequest r;
  for (int i = 0; i < span_at; ++i) r.prompt_ids.push_back(i == 0 ? 0 : 1000 + 7 * i);
  r.prompt_ids.insert(r.prompt_ids.end(), images->spans[0].types.size(), 129264);
  for (int i = 0; r.prompt_ids.size() < 72; ++i) r.prompt_ids.push_back(2000 + 11 * i);
  r.images = std::move(images);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  return r;
}

EngineOptions cache_options(bool prefix_cache) {
  EngineOptions o = exact_options(prefix_cache, 0);
  o.kv_block_tokens = 16;
  return o;
}

// The same image at the same place after a finished request restores the prompt's whole blocks past
// the span and replays one window after it (bounded replay: an approximation, spec §8, so its ids
// are not compared with a cold run's).
TEST(ImageEngine, TheSameImageHitsThePrefixCache) {
  auto engine = make_engine(vision_checkpoint(1), cache_options(true));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto first = generate(**engine, long_image_request(1, 3));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->cached_tokens, 0);
  auto second = generate(**engine, long_image_request(1, 3));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->cached_tokens, 64);  // the 4 whole blocks of the 72-token prompt
  EXPECT_EQ(second->replayed_tokens, 16);  // one window, after the span: its ViT did not run again
  auto fresh_engine = make_engine(vision_checkpoint(1), cache_options(false));
  ASSERT_TRUE(fresh_engine.ok());
  auto fresh = generate(**fresh_engine, long_image_request(1, 3));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(first->output_ids, fresh->output_ids);
}

// A replay whose window would start inside the span starts at the span (the reference prefills a span
// in one chunk): 64 - 16 = 48 lies in the span [44, 52), so 20 tokens are replayed.
TEST(ImageEngine, AReplayStartsAtTheSpanItWouldCut) {
  auto engine = make_engine(vision_checkpoint(1), cache_options(true));
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE(generate(**engine, long_image_request(1, 3, 44)).ok());
  auto second = generate(**engine, long_image_request(1, 3, 44));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->cached_tokens, 64);
  EXPECT_EQ(second->replayed_tokens, 20);
}

// Another image behind the same ids restores only the blocks before its span: it gives bit for bit
// what an engine gives whose cache only ever held those ids as text (the KV of positions before the
// span is the same whatever follows). The same image read at another grid, and a text request with
// the image token at those positions, miss at the span too.
TEST(ImageEngine, AnotherImageMissesAtItsSpan) {
  auto engine = make_engine(vision_checkpoint(1), cache_options(true));
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE(generate(**engine, long_image_request(1, 3)).ok());
  auto second = generate(**engine, long_image_request(2, 3));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->cached_tokens, 32);  // blocks 0 and 1; block 2 holds the span
  auto text_first = make_engine(vision_checkpoint(1), cache_options(true));
  ASSERT_TRUE(text_first.ok());
  GenerationRequest text = long_image_request(1, 2);
  text.images.reset();
  ASSERT_TRUE(generate(**text_first, text).ok());
  auto expected = generate(**text_first, long_image_request(2, 3));
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(expected->cached_tokens, 32);
  EXPECT_EQ(second->output_ids, expected->output_ids);

  GenerationRequest regrid = long_image_request(1, 3);
  regrid.images->spans[0].n_vit_w = 5;  // still ceil(5 / 3) = 2 tokens a row: the same span length
  regrid.images->spans[0].patches = model::testing::golden_patches(4, 5, kPatch, 1);
  auto third = generate(**engine, regrid);
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(third->cached_tokens, 32);
  auto t = generate(**engine, text);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->cached_tokens, 32);
}

}  // namespace
}  // namespace cedar::runtime
