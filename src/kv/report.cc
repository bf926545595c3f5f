#include "kv/report.h"

#include <vector>

#include "kv/block_file.h"
#include "kv/kv_cache.h"

namespace cedar::kv {

Result<KvFootprint> measure_footprint(const CacheGeometry& g, int64_t context_tokens, bool persists_swa) {
  if (context_tokens <= 0) return invalid_argument("kv-report: context must be a positive number of tokens");
  KvCacheOptions opt;
  opt.capacity_blocks = blocks_for_tokens(context_tokens, g.block_tokens);
  CEDAR_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::create(g, opt));
  CEDAR_ASSIGN_OR_RETURN(Sequence * seq, cache->new_sequence());
  // Token ids do not matter to the sizes; appending reserves every block the context needs.
  const std::vector<int32_t> tokens(static_cast<size_t>(context_tokens), 0);  // [context_tokens]
  CEDAR_RETURN_IF_ERROR(cache->append(*seq, tokens));

  KvFootprint f;
  f.model = g.model_name;
  f.family = g.family;
  f.context_tokens = context_tokens;
  f.block_tokens = g.block_tokens;
  f.kv_owner_layers = static_cast<int>(g.owners.size());
  f.blocks_allocated = cache->pool().blocks_in_use();
  f.main_kv_bytes = f.blocks_allocated * g.block_main_bytes;
  f.index_key_bytes = f.blocks_allocated * g.block_index_bytes;
  f.global_bytes = f.blocks_allocated * g.block_bytes;
  const double n = static_cast<double>(context_tokens);
  f.main_kv_bytes_per_token = static_cast<double>(f.main_kv_bytes) / n;
  f.index_key_bytes_per_token = static_cast<double>(f.index_key_bytes) / n;
  f.global_bytes_per_token = static_cast<double>(f.global_bytes) / n;

  f.window_layers = g.n_window_layers;
  f.backbone_window_layers = g.n_backbone_window_layers;
  const uint64_t ring = uint64_t{g.window_slots} * g.window_entry_bytes;
  // The sequence's window mapping is the real allocation; the backbone share is its per-layer slice.
  f.swa_bytes_per_sequence = seq->window_bytes();
  f.swa_backbone_bytes_per_sequence = ring * static_cast<uint64_t>(g.n_backbone_window_layers);
  f.compressor_tail_bytes_per_sequence = g.live_tail_bytes_per_sequence();
  f.engram_history_bytes_per_sequence = g.engram_history_bytes();
  f.boundary_state_bytes_per_block = g.boundary_state_bytes;

  // Size of one block file as DiskPrefixCache writes it, uncompressed (block_file.h layout).
  BlockFileHeader h;
  h.block_tokens = g.block_tokens;
  h.boundary_state_bytes = g.boundary_state_bytes;
  h.raw_payload_bytes = h.stored_payload_bytes = g.block_bytes;
  f.block_file_bytes = h.file_bytes();
  f.persists_swa = persists_swa;
  f.persisted_bytes_per_token_without_swa = static_cast<double>(f.block_file_bytes) / g.block_tokens;
  f.persisted_bytes_per_token_with_swa =
      f.persisted_bytes_per_token_without_swa + static_cast<double>(f.swa_bytes_per_sequence) / n;
  f.persisted_bytes_per_token =
      persists_swa ? f.persisted_bytes_per_token_with_swa : f.persisted_bytes_per_token_without_swa;
  f.reserved_bytes = cache->pool().reserved_kv_bytes() + cache->pool().reserved_boundary_bytes() +
                     seq->private_bytes();
  cache->release(seq);
  return f;
}

nlohmann::json footprint_to_json(const KvFootprint& f) {
  nlohmann::json j;
  j["model"] = f.model;
  j["family"] = kv_family_name(f.family);
  j["context_tokens"] = f.context_tokens;
  j["block_tokens"] = f.block_tokens;
  j["blocks_allocated"] = f.blocks_allocated;
  j["kv_owner_layers"] = f.kv_owner_layers;
  j["components_bytes_per_token"] = {{"main_kv", f.main_kv_bytes_per_token},
                                     {"index_keys", f.index_key_bytes_per_token}};
  j["global_bytes_per_token"] = f.global_bytes_per_token;
  j["global_bytes"] = f.global_bytes;
  j["global_gib"] = static_cast<double>(f.global_bytes) / (1024.0 * 1024.0 * 1024.0);
  j["swa_bytes_per_sequence"] = f.swa_bytes_per_sequence;
  j["swa_backbone_bytes_per_sequence"] = f.swa_backbone_bytes_per_sequence;
  j["window_layers"] = f.window_layers;
  j["compressor_tail_bytes_per_sequence"] = f.compressor_tail_bytes_per_sequence;
  j["engram_history_bytes_per_sequence"] = f.engram_history_bytes_per_sequence;
  j["boundary_state_bytes_per_block"] = f.boundary_state_bytes_per_block;
  j["block_file_bytes"] = f.block_file_bytes;
  j["persists_swa"] = f.persists_swa;
  j["persisted_bytes_per_token"] = f.persisted_bytes_per_token;
  j["persisted_bytes_per_token_without_swa"] = f.persisted_bytes_per_token_without_swa;
  j["persisted_bytes_per_token_with_swa"] = f.persisted_bytes_per_token_with_swa;
  j["reserved_address_space_bytes"] = f.reserved_bytes;
  return j;
}

}  // namespace cedar::kv
