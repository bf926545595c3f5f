#include "kv/geometry.h"

#include <xxhash.h>


namespace cedar::kv {

const char* kv_family_name(KvFamily f) {
  switch (f) {
    case KvFamily::kV41: return "v4.1";
    case KvFamily::kV4: return "v4";
    case KvFamily::kDenseGqa: return "dense-gqa";
  }
  return "?";
}

uint32_t main_entry_bytes(const ModelKvSpec& s) {
  switch (s.family) {
    case KvFamily::kV41:
      return static_cast<uint32_t>(s.bf16_entries ? s.head_dim * 2 : s.head_dim / 2 + s.head_dim / 16);
    case KvFamily::kV4: {
      const int nope = s.head_dim - s.rope_head_dim;
      const uint32_t raw = static_cast<uint32_t>(nope + 2 * s.rope_head_dim + nope / 64);
      return (raw + 7u) & ~7u;  // FlashMLA MODEL1 pads the record to 8 bytes
    }
    case KvFamily::kDenseGqa:
      return static_cast<uint32_t>(2 * s.n_kv_heads * s.head_dim * 2);
  }
  return 0;
}

uint32_t index_entry_bytes(const ModelKvSpec& s) {
  if (s.family == KvFamily::kDenseGqa) return 0;
  return static_cast<uint32_t>(s.index_head_dim / 2 + s.index_head_dim / 32);
}

uint32_t window_entry_bytes(const ModelKvSpec& s) {
  switch (s.family) {
    case KvFamily::kV41: return static_cast<uint32_t>(s.bf16_entries ? s.head_dim * 2 : s.head_dim + s.head_dim / 32);
    case KvFamily::kV4: return main_entry_bytes(s);  // same MODEL1 record as the compressed KV
    case KvFamily::kDenseGqa: return 0;
  }
  return 0;
}

namespace {

// fp32 kv + score state of a compressor, per the reference's buffers (spec §4.4 step 3, §4.10).
void tail_bytes(const ModelKvSpec& s, const LayerKvSpec& l, uint64_t& live, uint64_t& boundary) {
  live = boundary = 0;
  const int r = l.compress_ratio;
  if (s.family == KvFamily::kV41) {
    // Ratio 1 is a plain projection with no state; ratio r > 1 holds r slots of head_dim.
    if (r > 1) live = 2ull * r * s.head_dim * sizeof(float);
    // No overlap: at a block boundary (a multiple of r) no group is pending.
    return;
  }
  if (s.family == KvFamily::kV4) {
    if (r == 4) {
      // Overlapping windows: 2r slots of 2*head_dim, plus the indexer's own overlapping compressor.
      live = 2ull * (2 * r) * (2 * s.head_dim) * sizeof(float) +
             2ull * (2 * r) * (2 * s.index_head_dim) * sizeof(float);
      // The previous group also feeds the next entry, so an exact V4 resume would need part of this
      // state at a boundary too. cedar persists no V4 prefixes and the tech report's persistent-cache
      // accounting (spec §5.4) counts KV only, so it is left out of the V4 boundary record.
    } else if (r > 1) {
      live = 2ull * r * s.head_dim * sizeof(float);
    }
  }
}

}  // namespace

Result<CacheGeometry> make_cache_geometry(const ModelKvSpec& spec, uint32_t block_tokens,
                                          int n_backbone_layers) {
  if (block_tokens == 0) return invalid_argument("kv: block_tokens must be positive");
  if (spec.layers.empty()) return invalid_argument("kv: model '" + spec.name + "' has no layers");
  if (spec.head_dim <= 0 || spec.head_dim % 32 != 0)
    return invalid_argument("kv: head_dim " + std::to_string(spec.head_dim) + " must be a positive multiple of 32");
  if (spec.family != KvFamily::kDenseGqa && (spec.index_head_dim <= 0 || spec.index_head_dim % 32 != 0))
    return invalid_argument("kv: index_head_dim " + std::to_string(spec.index_head_dim) +
                            " must be a positive multiple of 32");
  if (spec.family == KvFamily::kV4 && (spec.rope_head_dim <= 0 || spec.rope_head_dim >= spec.head_dim))
    return invalid_argument("kv: rope_head_dim must be in (0, head_dim)");
  if (spec.family == KvFamily::kDenseGqa && spec.n_kv_heads <= 0)
    return invalid_argument("kv: dense baseline needs n_kv_heads > 0");
  if (spec.engram_history < 0 || static_cast<uint32_t>(spec.engram_history) > block_tokens)
    return invalid_argument("kv: engram history " + std::to_string(spec.engram_history) +
                            " must be in [0, block_tokens]");

  CacheGeometry g;
  g.model_name = spec.name;
  g.family = spec.family;
  g.block_tokens = block_tokens;
  g.n_layers = static_cast<int>(spec.layers.size());
  g.owner_of_layer.assign(g.n_layers, -1);
  g.window_of_layer.assign(g.n_layers, -1);
  g.window_slots = spec.family == KvFamily::kDenseGqa ? 0 : static_cast<uint32_t>(spec.window_size);
  g.window_entry_bytes = window_entry_bytes(spec);
  g.engram_history = static_cast<uint32_t>(spec.engram_history);
  g.model_fingerprint = spec.model_fingerprint;

  const uint32_t main_bytes = main_entry_bytes(spec);
  const uint32_t index_bytes = index_entry_bytes(spec);
  std::vector<int> owner_index_of_layer(g.n_layers, -1);
  for (int i = 0; i < g.n_layers; ++i) {
    const LayerKvSpec& l = spec.layers[i];
    const std::string where = "kv: model '" + spec.name + "' layer " + std::to_string(l.layer);
    if (l.layer != i) return invalid_argument(where + ": layers must be listed in order 0..n-1");
    if (l.compress_ratio < 0) return invalid_argument(where + ": negative compress_ratio");
    if (l.has_window && g.window_slots > 0) {
      g.window_of_layer[i] = g.n_window_layers++;
      if (n_backbone_layers < 0 || i < n_backbone_layers) ++g.n_backbone_window_layers;
    }
    if (!l.owns_compressed_kv) continue;
    if (l.compress_ratio == 0) return invalid_argument(where + ": owns compressed KV but has ratio 0");
    if (block_tokens % static_cast<uint32_t>(l.compress_ratio) != 0)
      return invalid_argument(where + ": compress ratio " + std::to_string(l.compress_ratio) +
                              " does not divide the block size " + std::to_string(block_tokens) +
                              " (choose a block size that is a multiple of every ratio)");
    OwnerGeometry o;
    o.layer = i;
    o.ratio = l.compress_ratio;
    o.main_entry_bytes = main_bytes;
    o.index_entry_bytes = l.owns_index_keys ? index_bytes : 0;
    o.entries_per_block = block_tokens / static_cast<uint32_t>(o.ratio);
    tail_bytes(spec, l, o.live_tail_bytes, o.boundary_tail_bytes);
    owner_index_of_layer[i] = static_cast<int>(g.owners.size());
    g.owners.push_back(o);
  }
  for (int i = 0; i < g.n_layers; ++i) {
    const LayerKvSpec& l = spec.layers[i];
    if (l.kv_from < 0) continue;
    const std::string where = "kv: model '" + spec.name + "' layer " + std::to_string(l.layer);
    if (l.kv_from >= g.n_layers || owner_index_of_layer[l.kv_from] < 0)
      return invalid_argument(where + ": kv_from " + std::to_string(l.kv_from) + " is not a KV-owner layer");
    if (l.kv_from > i) return invalid_argument(where + ": reads KV of a later layer " + std::to_string(l.kv_from));
    const OwnerGeometry& o = g.owners[owner_index_of_layer[l.kv_from]];
    if (o.ratio != l.compress_ratio)
      return invalid_argument(where + ": ratio " + std::to_string(l.compress_ratio) + " differs from its owner's " +
                              std::to_string(o.ratio));
    g.owner_of_layer[i] = owner_index_of_layer[l.kv_from];
  }
  uint64_t offset = 0;
  for (OwnerGeometry& o : g.owners) {
    o.main_offset = offset;
    offset += uint64_t{o.entries_per_block} * o.main_entry_bytes;
    g.block_main_bytes += uint64_t{o.entries_per_block} * o.main_entry_bytes;
    o.index_offset = offset;
    offset += uint64_t{o.entries_per_block} * o.index_entry_bytes;
    g.block_index_bytes += uint64_t{o.entries_per_block} * o.index_entry_bytes;
    g.boundary_state_bytes += o.boundary_tail_bytes;
  }
  g.block_bytes = offset;
  g.boundary_state_bytes += g.engram_history_bytes();
  // A model with no compressed layer (window attention only) has blocks of zero bytes: its sequences
  // still keep their windows and tails here.
  return g;
}

uint64_t CacheGeometry::live_tail_bytes_per_sequence() const {
  uint64_t n = 0;
  for (const OwnerGeometry& o : owners) n += o.live_tail_bytes;
  return n;
}

uint64_t CacheGeometry::boundary_tail_offset(int o) const {
  uint64_t off = 0;
  for (int i = 0; i < o; ++i) off += owners[i].boundary_tail_bytes;
  return off;
}

uint64_t CacheGeometry::engram_history_offset() const {
  return boundary_tail_offset(static_cast<int>(owners.size()));
}

uint64_t CacheGeometry::layout_fingerprint() const {
  // Every field that changes what a byte of a block means goes into the hash.
  std::vector<uint64_t> words = {0x63656461726b7631ull /* "cedarkv1" */, model_fingerprint,
                                 static_cast<uint64_t>(family), block_tokens, window_slots,
                                 window_entry_bytes, engram_history, block_bytes, boundary_state_bytes};
  for (const OwnerGeometry& o : owners) {
    words.insert(words.end(), {static_cast<uint64_t>(o.layer), static_cast<uint64_t>(o.ratio),
                               o.main_entry_bytes, o.index_entry_bytes, o.boundary_tail_bytes});
  }
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
}

}  // namespace cedar::kv
