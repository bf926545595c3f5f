// LayerPlan: per layer, what the attention does and where it borrows state from. Derived once from
// ModelConfig (spec §4.5 for V4.1, §4.10 for V4); the forward pass, the KV cache and `inspect` all
// read this table and never re-derive it.
#pragma once

#include <string>
#include <vector>

#include "spec/config.h"

namespace cedar::model {

enum class AttnMode {
  kSwa,      // sliding window only (ratio 0)
  kFull,     // owns a compressor + index keys + indexer (V4.1 KV source)
  kReindex,  // own indexer over the source's KV and index keys (V4.1 index source, not a KV source)
  kReuse,    // reuses the source's KV and the last indexer's top-k
  kCsa,      // V4: own compressor (ratio 4, overlapping) + own indexer
  kHca,      // V4: own compressor (ratio 128), attends every compressed entry
};
enum class CandidateRole { kNone, kBuildsPool, kConsumer };

struct RopeSpec {
  double theta = 10000;
  bool yarn = false;   // YaRN correction (factor, beta_fast/slow, original_seq_len from config)
};

struct LayerPlanEntry {
  int layer = 0;               // 0..n_layers-1 backbone, then DSpark/MTP stages
  bool is_mtp = false;         // DSpark (V4.1) or MTP (V4) stage
  int compress_ratio = 0;
  AttnMode mode = AttnMode::kSwa;
  int kv_from = -1;            // layer owning the compressed main KV this layer attends (-1: none)
  int index_keys_from = -1;    // layer whose index keys this layer's indexer scores (-1: no indexer)
  int topk_from = -1;          // layer whose top-k selection this layer uses (-1: none)
  CandidateRole candidate = CandidateRole::kNone;
  int candidate_from = -1;     // layer that built the candidate pool this layer is restricted to
  RopeSpec rope;
  bool engram = false;         // an Engram module runs before this layer's block
  int engram_index = -1;       // index into engram_layer_ids
  bool hash_routed = false;    // V4: first n_hash_layers route by token id
  bool dspark_target = false;  // V4.1: this layer's attention input feeds DSpark
  bool encoder = false;        // V4.1 CED: layers before the candidate/decoder KV source
  int n_routed_experts = 0, n_activated_experts = 0;
};

struct LayerPlan {
  std::vector<LayerPlanEntry> layers;  // n_layers + n_mtp_layers entries
  // Distinct layers that own compressed KV (V4.1: kv_source_layers; V4: every compressed layer).
  std::vector<int> kv_owner_layers;
};

LayerPlan make_layer_plan(const ModelConfig& c);
const char* attn_mode_name(AttnMode m);

}  // namespace cedar::model
