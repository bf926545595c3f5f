// Config parsing and validation: the shipped configs load with the spec's values, and every
// class of bad input is rejected with a message naming the field.
#include "spec/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model_test_util.h"

namespace cedar::model {
namespace {

using nlohmann::json;
using testing::source_path;

json released_json() {
  std::ifstream in(source_path("configs/deepseek-v4.1-flash.json"));
  return json::parse(in);
}

std::string error_of(const json& j) {
  auto r = parse_config(j.dump());
  return r.ok() ? std::string("(accepted)") : r.status().message();
}

TEST(Config, ReleasedV41MatchesSpec) {
  ModelConfig c = testing::released_v41();
  EXPECT_EQ(c.family, ModelFamily::kV41);
  EXPECT_EQ(c.architecture, "DeepseekV41ForCausalLM");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_activated_experts, 6);
  EXPECT_DOUBLE_EQ(c.route_scale, 1.5);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_DOUBLE_EQ(c.rope_factor, 16);
  EXPECT_DOUBLE_EQ(c.compress_rope_theta, 160000);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_TRUE(c.vision.present);
  EXPECT_EQ(c.vision.n_layers, 32);
}

TEST(Config, FlatV4FlashLoads) {
  auto c = load_config(source_path("configs/deepseek-v4-flash.json"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->family, ModelFamily::kV4);
  EXPECT_EQ(c->dim, 4096);
  EXPECT_EQ(c->n_layers, 43);
  EXPECT_EQ(c->n_hash_layers, 3);
  EXPECT_EQ(c->compress_ratios.size(), 44u);
  EXPECT_EQ(c->weight_block_size, 128);
  EXPECT_DOUBLE_EQ(c->norm_eps, 1e-6);
}

TEST(Config, RoundTripsThroughHfJson) {
  ModelConfig c = testing::released_v41();
  auto again = parse_config(config_to_hf_json(c));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->compress_ratios, c.compress_ratios);
  EXPECT_EQ(again->engram_num_embeddings, c.engram_num_embeddings);
  EXPECT_EQ(again->dspark_target_layer_ids, c.dspark_target_layer_ids);
  EXPECT_EQ(again->dim, c.dim);
}

TEST(Config, ErrorsNameTheField) {
  json j = released_json();
  j["text_config"]["compress_ratios"].erase(0);
  EXPECT_NE(error_of(j).find("compress_ratios has 42 entries"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"].erase("hidden_size");
  EXPECT_NE(error_of(j).find("'hidden_size'"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["kv_source_layer_ids"] = {2, 8, 14, 41};
  EXPECT_NE(error_of(j).find("kv_source_layer_ids[3] = 41"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["kv_source_layer_ids"] = {1, 8, 14, 20};  // layer 1 is SWA-only
  EXPECT_NE(error_of(j).find("compress_ratio is 0"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["index_source_layer_ids"] = {2, 8, 20, 24};  // 14 is a KV source but not indexed
  EXPECT_NE(error_of(j).find("kv source layer 14"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["candidate_source_layer_id"] = 21;
  EXPECT_NE(error_of(j).find("candidate_source_layer_id 21"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["num_attention_heads"] = "64";
  EXPECT_NE(error_of(j).find("'num_attention_heads' must be an integer"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["engram_num_embeddings"] = {384006169, 384016682};
  EXPECT_NE(error_of(j).find("engram_num_embeddings[0]"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["compress_ratios"][41] = 1;  // a DSpark stage with compression
  EXPECT_NE(error_of(j).find("DSpark stage"), std::string::npos) << error_of(j);

  j = released_json();
  j["text_config"]["compress_ratios"][5] = 3;
  EXPECT_NE(error_of(j).find("compress_ratios[5] = 3"), std::string::npos) << error_of(j);

  j = released_json();
  j["quantization_config"]["weight_block_size"] = {32, 64};
  EXPECT_NE(error_of(j).find("weight_block_size"), std::string::npos) << error_of(j);

  EXPECT_NE(error_of(json::array()).find("top level"), std::string::npos);
  auto bad = parse_config("{not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);

  j = released_json();
  j.erase("text_config");
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("'llama'"), std::string::npos) << error_of(j);
}

TEST(Config, MissingFileIsNotFound) {
  auto r = load_config("/nonexistent/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace cedar::model
