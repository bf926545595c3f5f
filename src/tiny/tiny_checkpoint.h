// make-tiny: writes a small checkpoint in exactly the released V4.1 layout (HF config.json,
// sharded safetensors + index, released tensor names / dtypes / block scales, tokenizer files),
// with seeded random weights. Dimensions shrink; the 40 + 3 layer structure stays whole.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "spec/config.h"

namespace cedar::model {

// Every preset has the released 3 DSpark stages (mtp.*, docs/DSPARK.md) with fewer experts.
// kTiny: ~40 MB, dims tiny. kSmall: ~1.6 GB. kStream: the released routed-expert shapes (dim 5120,
// moe_inter 2304: 17.9 MiB per expert), 96 experts in each of 6 layers (8 in each DSpark stage) and Engram
// tables of 2.5 GB each, ~18 GB in all: for measuring SSD streaming (bench/stream_bench.sh). Its
// experts and Engram tables are drawn from bytes directly (random E2M1 codes with a fixed
// power-of-two scale per row), not quantised from floats, so that it writes in minutes.
// kAttention: the released attention, compressor, indexer, candidate pool and 40-layer plan (64 heads
// x 512, index 32 x 128, top-512, pool 2048 x 8, window 128) with dim 256, query / output LoRA ranks of
// 64, small experts and Engram, ~380 MB: for measuring what context depth costs on the released shapes.
enum class TinyPreset { kTiny, kSmall, kStream, kAttention };

// The preset's config. `engram_compressed_vocab_size` is filled by the caller from the tokenizer
// that ships with the checkpoint (its class count under the Engram normaliser chain).
ModelConfig tiny_config(TinyPreset preset);
// The same config without DSpark stages (`make-tiny --no-dspark`): no mtp.* tensors, and the config
// says num_nextn_predict_layers 0 and dspark_block_size 0.
void remove_dspark(ModelConfig& c);

// A vision tower for test checkpoints (`cedar make-tiny --vision`): the released layout (vision.*,
// aligner.*, image_start/end/newline, the gates' bias_vl) and processor settings, with a 2-block,
// 64-wide, 4-head tower (head dim 16, SwiGLU 48) over 14x14 patches and a 3x3 merge into the LLM's
// width. Every tensor is drawn from (seed, name): adding the tower leaves the backbone's tensors as
// they were.
VisionConfig tiny_vision_config();

// The tokenizer a test checkpoint ships: `dir`/tokenizer.json (or tokenizer.json.zst) with DeepSeek-V4.1's control markers
// made single tokens (tokenizer/marker_tokens.h), `dir`/tokenizer_config.json as is, and the facts
// the checkpoint's config takes from it.
struct TinyTokenizer {
  std::string tokenizer_json;
  std::string config_json;                 // empty when `dir` has no tokenizer_config.json
  int vocab_size = 0;                      // ids in use (must not exceed the config's vocab_size)
  int engram_classes = 0;                  // the config's engram_compressed_vocab_size
  std::vector<std::string> added_markers;  // "marker=id" for each marker given a placeholder
};
Result<TinyTokenizer> prepare_tiny_tokenizer(const std::string& dir);

struct TinyOptions {
  std::string out_dir;
  uint64_t seed = 0;
  TinyPreset preset = TinyPreset::kTiny;
  const TinyTokenizer* tokenizer = nullptr;  // written into out_dir when set
  int n_shards = 0;           // 0 = preset default
  std::function<void(int shard, int n_shards)> progress;
};

// Writes the checkpoint for `config` (which must validate) into options.out_dir.
Status write_tiny_checkpoint(const ModelConfig& config, const TinyOptions& options);

// Portable seeded generator for weights: identical bits on every platform and compiler (integer
// arithmetic only; no libm in the sampling path).
class WeightRng {
 public:
  explicit WeightRng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  // Uniform in [-1, 1) with 24 random bits.
  float uniform_pm1();
  // Approximately normal(0, 1): Irwin-Hall sum of 4 uniforms, rescaled (support ±3.46).
  float normalish();

 private:
  uint64_t state_;
};

}  // namespace cedar::model
