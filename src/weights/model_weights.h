// Typed views of every weight the forward pass reads, bound once from the WeightMap. Quantised and
// bf16 matrices point into the checkpoint mapping (never copied). wo_a, which the reference
// dequantises to bf16 at load (convert.py), stays FP8 and is read through linear_fp8_bf16 (the same
// values, half the bytes). Small f32 vectors whose mapped bytes are not 4-byte aligned are copied so
// they can be read as floats.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "spec/config.h"
#include "spec/layer_plan.h"
#include "weights/weight_map.h"
#include "ops/linear/bf16_coded.h"
#include "ops/linear/linear.h"

namespace cedar::model {

struct ExpertWeights {
  ops::Fp4Weight w1, w2, w3;  // routed experts (packed FP4)
};
struct SharedExpertWeights {
  ops::Fp8Weight w1, w2, w3;
};

struct AttentionWeights {
  const float* attn_sink = nullptr;     // [n_heads]
  ops::Fp8Weight wq_a;                  // [q_lora, dim]
  const uint16_t* q_norm = nullptr;     // [q_lora] bf16
  ops::Fp8Weight wq_b;                  // [n_heads*head_dim, q_lora]
  ops::Fp8Weight wkv;                   // [head_dim, dim]
  const uint16_t* kv_norm = nullptr;    // [head_dim]
  ops::Fp8Weight wo_a;                  // [o_groups*o_lora, n_heads*head_dim/o_groups], used as bf16
  ops::Fp8Weight wo_b;                  // [dim, o_groups*o_lora]
  // KV source only.
  ops::Bf16Weight comp_wkv;             // [head_dim, dim]
  ops::Bf16Weight comp_wgate;           // [head_dim, dim] (ratio 2 only)
  const uint16_t* comp_norm = nullptr;  // [head_dim]
  ops::Bf16Weight idx_wk;               // [index_head_dim, head_dim]
  const uint16_t* idx_k_norm = nullptr; // [index_head_dim]
  // Index source only.
  ops::Fp8Weight idx_wq_b;              // [index_n_heads*index_head_dim, q_lora]
  ops::Bf16Weight idx_weights_proj;     // [index_n_heads, dim]
};

struct EngramWeights {
  const uint8_t* table = nullptr;       // [rows, head_dim] E4M3
  const uint8_t* table_scale = nullptr; // [rows, head_dim/32] E8M0
  int64_t rows = 0;
  ops::Fp8Weight wkv;                   // [(hc+1)*dim, n_cols*head_dim]
  const uint16_t* q_weight = nullptr;   // [hc, dim] bf16
  const uint16_t* k_weight = nullptr;   // [hc, dim] bf16
};

struct BlockWeights {
  const uint16_t* attn_norm = nullptr;  // [dim]
  const uint16_t* ffn_norm = nullptr;
  const float* hc_attn_fn = nullptr;    // [mix, hc*dim]
  const float* hc_attn_base = nullptr;  // [mix]
  const float* hc_attn_scale = nullptr; // [3]
  const float* hc_ffn_fn = nullptr;
  const float* hc_ffn_base = nullptr;
  const float* hc_ffn_scale = nullptr;
  AttentionWeights attn;
  ops::Bf16Weight gate;                 // [n_experts, dim] (read as fp32 by the router)
  const float* gate_bias = nullptr;     // [n_experts]
  const float* gate_bias_vl = nullptr;  // [n_experts] or nullptr
  std::vector<ExpertWeights> experts;
  SharedExpertWeights shared;
  bool has_engram = false;
  EngramWeights engram;
};

// The DSpark stages (mtp.*, docs/DSPARK.md); the stages use the backbone's embed and head.
struct DsparkWeights {
  std::vector<BlockWeights> stages;     // window-only attention and the stages' MoE
  ops::Fp8Weight main_proj;             // mtp.0: [dim, n_targets * dim]
  const uint16_t* main_norm = nullptr;  // mtp.0: [dim]
  const uint16_t* norm = nullptr;       // last stage: [dim]
  ops::Bf16Weight markov_embed;         // last stage: [vocab, markov_rank]
  ops::Bf16Weight markov_head;          // last stage: [vocab, markov_rank], read as fp32
  ops::Bf16Weight confidence;           // last stage: [1, dim + markov_rank], read as fp32
};

struct ModelWeights {
  ops::Bf16Weight embed;                // [vocab, dim]
  ops::Bf16Weight head;                 // [vocab, dim]; head.coded points at head_coded when set
  const uint16_t* norm = nullptr;       // [dim]
  std::vector<BlockWeights> blocks;     // backbone layers
  std::unique_ptr<DsparkWeights> dspark;  // nullptr when the DSpark stages are not loaded
  // Owned copies (realigned bf16 and f32 vectors). Element addresses are stable.
  std::vector<std::unique_ptr<std::vector<uint16_t>>> owned_bf16;
  std::vector<std::unique_ptr<std::vector<float>>> owned_f32;
  // The head re-coded in 12 bits per weight for the fast kernels' GEMV (ops/linear/bf16_coded.h): the largest
  // matrix a decoded token reads, 2 bytes per weight in the checkpoint, 1.5 here. Anonymous memory;
  // the mapped bf16 head stays for the exact kernels and the GEMM of many rows (`cedar eval`'s logits).
  std::unique_ptr<ops::Bf16Coded> head_coded;
};

// Binds every backbone weight, and the DSpark stages' with `with_dspark` (the map must hold them).
// CEDAR_CHECKs only for inventory invariants WeightMap::bind proved.
Result<std::unique_ptr<ModelWeights>> bind_model_weights(const ModelConfig& c, const LayerPlan& plan,
                                                         const WeightMap& map, bool with_dspark = false);

}  // namespace cedar::model
