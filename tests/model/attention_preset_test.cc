// `make-tiny --preset attention`: the released attention, indexer, candidate pool and layer plan with
// small widths elsewhere. The released facts come from configs/deepseek-v4.1-flash.json (the release's
// config.json), not from the preset's code.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/thread_pool.h"
#include "spec/layer_plan.h"
#include "model/model.h"
#include "tiny/tiny_checkpoint.h"
#include "spec/weight_inventory.h"
#include "model_test_util.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

ModelConfig attention_config(int engram_classes) {
  ModelConfig c = tiny_config(TinyPreset::kAttention);
  c.engram_compressed_vocab_size = engram_classes;  // make-tiny fills it from the shipped tokenizer
  return c;
}

TEST(AttentionPreset, HasTheReleasedAttentionShapesAndLayerPlan) {
  const ModelConfig r = testing::released_v41();
  const ModelConfig c = attention_config(r.engram_compressed_vocab_size);
  ASSERT_TRUE(validate_config(c).ok()) << validate_config(c).to_string();

  // Attention, compressor, indexer, candidate pool and window as released.
  EXPECT_EQ(c.n_heads, r.n_heads);
  EXPECT_EQ(c.head_dim, r.head_dim);
  EXPECT_EQ(c.rope_head_dim, r.rope_head_dim);
  EXPECT_EQ(c.o_groups, r.o_groups);
  EXPECT_EQ(c.window_size, r.window_size);
  EXPECT_EQ(c.index_n_heads, r.index_n_heads);
  EXPECT_EQ(c.index_head_dim, r.index_head_dim);
  EXPECT_EQ(c.index_topk, r.index_topk);
  EXPECT_EQ(c.candidate_source_layer, r.candidate_source_layer);
  EXPECT_EQ(c.candidate_topk_blocks, r.candidate_topk_blocks);
  EXPECT_EQ(c.candidate_block_size, r.candidate_block_size);
  EXPECT_EQ(c.compress_ratios, r.compress_ratios);
  EXPECT_EQ(c.kv_source_layers, r.kv_source_layers);
  EXPECT_EQ(c.index_source_layers, r.index_source_layers);
  EXPECT_EQ(c.n_layers, r.n_layers);
  EXPECT_EQ(c.n_mtp_layers, r.n_mtp_layers);
  EXPECT_EQ(c.max_position_embeddings, r.max_position_embeddings);
  EXPECT_EQ(c.rope_theta, r.rope_theta);
  EXPECT_EQ(c.compress_rope_theta, r.compress_rope_theta);
  EXPECT_EQ(c.rope_factor, r.rope_factor);
  EXPECT_EQ(c.original_seq_len, r.original_seq_len);
  EXPECT_EQ(c.n_activated_experts, r.n_activated_experts);
  EXPECT_EQ(c.engram_layer_ids, r.engram_layer_ids);

  // The same Full / Reindex / Reuse plan, layer by layer, with the same sources.
  const LayerPlan pc = make_layer_plan(c), pr = make_layer_plan(r);
  ASSERT_EQ(pc.layers.size(), pr.layers.size());
  EXPECT_EQ(pc.kv_owner_layers, pr.kv_owner_layers);
  for (size_t l = 0; l < pr.layers.size(); ++l) {
    const LayerPlanEntry &a = pc.layers[l], &b = pr.layers[l];
    EXPECT_EQ(a.mode, b.mode) << "layer " << l;
    EXPECT_EQ(a.compress_ratio, b.compress_ratio) << "layer " << l;
    EXPECT_EQ(a.kv_from, b.kv_from) << "layer " << l;
    EXPECT_EQ(a.index_keys_from, b.index_keys_from) << "layer " << l;
    EXPECT_EQ(a.topk_from, b.topk_from) << "layer " << l;
    EXPECT_EQ(a.candidate, b.candidate) << "layer " << l;
    EXPECT_EQ(a.candidate_from, b.candidate_from) << "layer " << l;
    EXPECT_EQ(a.encoder, b.encoder) << "layer " << l;
  }

  // Every attention tensor whose shape does not involve dim or the LoRA ranks has the released shape
  // (sinks, KV and compressor norms, index-key projection and norm).
  std::map<std::string, std::vector<int64_t>> released_shapes;
  for (const WeightSpec& w : weight_inventory(r)) released_shapes[w.name] = w.shape;
  int compared = 0;
  for (const WeightSpec& w : weight_inventory(c)) {
    if (!w.name.ends_with("attn_sink") && !w.name.ends_with("kv_norm.weight") &&
        !w.name.ends_with("compressor.norm.weight") && !w.name.ends_with("indexer.wk.weight") &&
        !w.name.ends_with("indexer.k_norm.weight"))
      continue;
    ASSERT_TRUE(released_shapes.count(w.name)) << w.name << " is not in the released inventory";
    EXPECT_EQ(w.shape, released_shapes[w.name]) << w.name;
    ++compared;
  }
  EXPECT_EQ(compared, 43 + 43 + 4 * 3);  // sinks and KV norms per layer and stage; 3 per KV source
}

// The preset exists to stay small: well under half a gigabyte (the released model is ~160 GB).
TEST(AttentionPreset, CheckpointStaysSmall) {
  const ParamCounts n = count_params(weight_inventory(attention_config(99092)));
  EXPECT_LT(n.total_bytes(), int64_t{400} << 20);
}

// The written checkpoint loads and runs: a short prefill and two decode steps give finite logits.
TEST(AttentionPreset, WritesLoadsAndRunsAForward) {
  auto tok = prepare_tiny_tokenizer(testing::repo_tokenizer_dir());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const std::string dir =
      std::string(CEDAR_BINARY_DIR) + "/model_test_data/attention_preset." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TinyOptions opt;
  opt.out_dir = dir;
  opt.seed = 1;
  opt.preset = TinyPreset::kAttention;
  opt.tokenizer = &*tok;
  const Status st = write_tiny_checkpoint(attention_config(tok->engram_classes), opt);
  ASSERT_TRUE(st.ok()) << st.to_string();
  {
    auto m = Model::load(dir);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ((*m)->config().n_heads, 64);
    EXPECT_EQ((*m)->config().head_dim, 512);
    ThreadPool pool(2);
    SequenceState seq = (*m)->new_sequence(64);
    const std::vector<int32_t> ids = testing::test_prompt(12, 40);
    std::vector<float> logits((*m)->config().vocab_size);
    for (size_t begin : {size_t{0}, size_t{10}, size_t{11}}) {
      const size_t end = begin == 0 ? 10 : begin + 1;
      SeqChunk chunk{&seq, std::span<const int32_t>(ids).subspan(begin, end - begin)};
      const Status f = (*m)->forward({&chunk, 1}, logits.data(), &pool);
      ASSERT_TRUE(f.ok()) << f.to_string();
      ASSERT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
      const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
      EXPECT_LT(*lo, *hi);  // not a constant row
    }
    EXPECT_EQ(seq.n_tokens, 12);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cedar::model
