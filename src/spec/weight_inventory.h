// The released checkpoint's tensor inventory (spec §3), derived from the config: every tensor's
// name, shape and dtype. make-tiny writes exactly this list; the weight map checks a checkpoint
// against it. Names are the released ones (reference naming, no "model." prefix).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "spec/config.h"

namespace cedar::model {

enum class WeightGroup { kBackbone, kEngram, kDspark, kVision };
const char* weight_group_name(WeightGroup g);

// What a tensor holds, so writers/loaders know how to fill or decode it.
enum class WeightKind {
  kNormWeight,   // RMSNorm gain (bf16), ~1
  kDenseBf16,    // plain bf16 matrix
  kDenseF32,     // plain f32 matrix or vector (hc_*_fn, attn_sink, gate bias)
  kFp8Weight,    // F8_E4M3 [n, k] with a 32x32 (weight_block_size) E8M0 scale tensor `<name minus .weight>.scale`
  kFp4Weight,    // I8 packed E2M1 [n, k/2] with an E8M0 scale per 32 along k
  kScale,        // F8_E8M0 scale of the preceding quantised weight
  kEngramTable,  // F8_E4M3 rows [n_rows, head_dim] with per-32 E8M0 `.scale`
};

struct WeightSpec {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;  // as stored (packed FP4: bytes per row)
  WeightKind kind;
  WeightGroup group;
  int64_t n_params = 0;        // logical parameters (FP4 counts 2 per byte; scales count 0)
  int64_t n_bytes = 0;
};

// Every tensor of the checkpoint, in a stable order (top-level, then layers, then mtp, vision).
std::vector<WeightSpec> weight_inventory(const ModelConfig& c);

struct ParamCounts {
  int64_t backbone = 0, engram = 0, dspark = 0, vision = 0;
  int64_t backbone_bytes = 0, engram_bytes = 0, dspark_bytes = 0, vision_bytes = 0;
  int64_t routed_expert_params = 0, routed_expert_bytes = 0;  // part of backbone
  int64_t n_tensors = 0;
  int64_t total() const { return backbone + engram + dspark + vision; }
  int64_t total_bytes() const { return backbone_bytes + engram_bytes + dspark_bytes + vision_bytes; }
};
ParamCounts count_params(const std::vector<WeightSpec>& inventory);

}  // namespace cedar::model
