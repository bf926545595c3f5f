// CacheGeometry: the byte layout of one model's KV cache, derived once from a small per-layer
// description (ModelKvSpec) that the caller builds from its LayerPlan (the kv module does not link
// cedar_model; tools/cli/cmd_kv_report.cc shows the translation).
//
// What a sequence's cache holds (spec §5.1):
//   * global KV, one copy per KV-owner layer (V4.1: the KV sources 2, 8, 14, 20; V4: every compressed
//     layer; dense GQA: every layer), shared by the owner's Reuse / Reindex layers: `main` entries
//     (one per `ratio` tokens) and, for owners that produce them, `index` keys (same count);
//   * an SWA ring per layer with a window (128 slots);
//   * per-owner compressor tail state (the partial group still being pooled);
//   * the Engram n-gram history (compressed token ids of the last max_ngram_size - 1 positions).
// Global KV lives in fixed-size token blocks (block_pool.h). A block of `block_tokens` tokens stores,
// owner after owner, `block_tokens / ratio` main entries then as many index keys; nothing else, so
// `block_bytes / block_tokens` is exactly the global bytes per token (890 for V4.1).
// Entries are opaque fixed-size byte records: the formats (ops/formats/quant.h for V4.1) only set their sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::kv {

enum class KvFamily {
  kV41,       // DeepSeek-V4.1: CSA2 sharing, FP4 main KV (288 B), FP8 window (528 B)
  kV4,        // DeepSeek-V4: CSA ratio 4 + HCA ratio 128, FlashMLA MODEL1 entries (584 B)
  kDenseGqa,  // a dense GQA baseline: bf16 K and V per KV head, every layer, every token
};
const char* kv_family_name(KvFamily f);

// One layer as the cache sees it.
struct LayerKvSpec {
  int layer = 0;
  int compress_ratio = 0;         // 0: this layer reads no compressed (global) KV
  bool owns_compressed_kv = false;// its own compressor writes the global entries
  bool owns_index_keys = false;   // it also writes index keys next to them
  int kv_from = -1;               // owner layer of the global KV it reads (-1: none)
  bool has_window = true;         // keeps an SWA ring of window_size slots
};

// The model facts the cache layout depends on.
struct ModelKvSpec {
  std::string name;               // "deepseek-v4.1-flash", used in reports and logs
  KvFamily family = KvFamily::kV41;
  int head_dim = 512;             // latent width (V4.x) or per-KV-head width (dense)
  int rope_head_dim = 64;
  int index_head_dim = 128;
  int window_size = 128;
  int n_kv_heads = 1;             // dense GQA only
  int engram_history = 0;         // compressed ids kept for Engram (max_ngram_size - 1), 0 = none
  // V4.1 only: main and window entries kept as bf16 (head_dim * 2 bytes) instead of FP4 / FP8, the
  // `cedar eval` KV experiment (model/sequence_state.h KvDtype::kBf16). Index keys stay FP4.
  bool bf16_entries = false;
  std::vector<LayerKvSpec> layers;
  // Identity of the weights the cache was computed with (a hash of config + checkpoint, chosen by the
  // caller). Disk files and prefix hashes of a different model never match.
  uint64_t model_fingerprint = 0;
};

// Per KV-owner layer.
struct OwnerGeometry {
  int layer = 0;
  int ratio = 1;                  // tokens per global entry
  uint32_t main_entry_bytes = 0;
  uint32_t index_entry_bytes = 0; // 0: this owner stores no index keys
  uint32_t entries_per_block = 0; // block_tokens / ratio
  uint64_t main_offset = 0;       // byte offset of this owner's main entries inside a block
  uint64_t index_offset = 0;      // byte offset of its index keys inside a block
  // Compressor state of the group still being pooled, held per live sequence (fp32 kv + score).
  uint64_t live_tail_bytes = 0;
  // Part of that state that is still meaningful at a block boundary and must be saved with a prefix.
  // 0 for non-overlapping compressors: block_tokens is a multiple of the ratio, so no group is pending
  // at a boundary. (V4's overlapping ratio-4 compressors do carry state across one; not modelled, see
  // geometry.cc.)
  uint64_t boundary_tail_bytes = 0;
};

struct CacheGeometry {
  std::string model_name;
  KvFamily family = KvFamily::kV41;
  uint32_t block_tokens = 0;
  std::vector<OwnerGeometry> owners;
  int n_layers = 0;
  std::vector<int> owner_of_layer;   // [n_layers] index into owners of the global KV a layer reads, -1
  std::vector<int> window_of_layer;  // [n_layers] index of the layer's SWA ring, -1 when none
  int n_window_layers = 0;
  int n_backbone_window_layers = 0;  // windows of layers flagged as backbone (see make_cache_geometry)
  uint32_t window_slots = 0;
  uint32_t window_entry_bytes = 0;
  uint32_t engram_history = 0;       // int64 ids per sequence
  uint64_t block_bytes = 0;          // global KV bytes of one block (main + index of every owner)
  uint64_t block_main_bytes = 0;     // of which main entries
  uint64_t block_index_bytes = 0;    // of which index keys
  // Small per-block record saved with each block: every owner's boundary tail, then the Engram
  // history (int64 each) as of the block's last token. What a resume at that boundary needs besides KV.
  uint64_t boundary_state_bytes = 0;
  uint64_t model_fingerprint = 0;

  // Model fingerprint mixed with the layout, so a cache written with another block size or entry
  // format never matches (prefix-hash seed and disk-file identity).
  uint64_t layout_fingerprint() const;
  // Per-sequence bytes outside the block pool.
  uint64_t window_bytes_per_sequence() const {
    return uint64_t{window_slots} * window_entry_bytes * static_cast<uint64_t>(n_window_layers);
  }
  uint64_t live_tail_bytes_per_sequence() const;
  uint64_t engram_history_bytes() const { return uint64_t{engram_history} * sizeof(int64_t); }
  // Offset of owner `o`'s boundary tail inside the boundary-state record; the Engram history follows
  // the last owner at engram_history_offset().
  uint64_t boundary_tail_offset(int o) const;
  uint64_t engram_history_offset() const;
};

// Packed entry sizes per family, written from the spec (§5.1 V4.1, §5.3 V4, §5.5 dense).
// V4.1: main = head_dim/2 E2M1 bytes + head_dim/16 E4M3 scales (512 -> 288);
//       index = index_head_dim/2 + index_head_dim/32 E8M0 (128 -> 68);
//       window = head_dim E4M3 + head_dim/32 E8M0 (512 -> 528).
// V4:   main = window = nope E4M3 + rope bf16 + nope/64 E8M0, padded to 8 (448+128+7+1 = 584);
//       index as V4.1.
// V4.1 with bf16_entries: main = window = head_dim * 2.
// Dense: main = K and V, bf16, every KV head: 2 * n_kv_heads * head_dim * 2 (8 x 128 -> 4096).
uint32_t main_entry_bytes(const ModelKvSpec& spec);
uint32_t index_entry_bytes(const ModelKvSpec& spec);
uint32_t window_entry_bytes(const ModelKvSpec& spec);

// Builds the layout; every ratio must divide block_tokens. Errors name the offending layer/field.
// `n_backbone_layers` only splits the SWA figure into backbone and draft (DSpark/MTP) windows.
Result<CacheGeometry> make_cache_geometry(const ModelKvSpec& spec, uint32_t block_tokens,
                                          int n_backbone_layers = -1);

inline constexpr uint32_t kDefaultBlockTokens = 256;

}  // namespace cedar::kv
