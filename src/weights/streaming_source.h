// The streaming WeightSource: routed experts and Engram rows live on the SSD and are read on demand
// into two io::SlotCache slabs (experts with O_DIRECT, Engram rows buffered into compact slots),
// sized by the residency plan. Dense weights stay mapped.
//
// Experts are keyed by (layer, id); each expert's six tensors are read as few 4 KiB-aligned extents
// (neighbouring tensors merged), straight from the shards at the tensors' offsets. Routing counts
// per expert are kept in a sidecar file (save_stats), and the next start preloads the most used
// experts, so a restart begins warm.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "io/checkpoint.h"
#include "spec/config.h"
#include "spec/layer_plan.h"
#include "weights/weight_map.h"
#include "weights/weight_source.h"

namespace cedar::model {

struct StreamingOptions {
  size_t expert_slots = 0;       // experts resident at once (>= 1)
  size_t engram_slots = 0;       // Engram rows resident at once (>= 1 when the model has Engram)
  std::string stats_file;        // sidecar with routing counts; empty = none
  bool warm_start = true;        // preload the most used experts from stats_file
  bool direct_io = true;         // O_DIRECT for experts where the filesystem allows
  bool io_uring = true;          // else the pread pool
};

// The tensors a streaming run reads itself (routed experts of backbone layers, Engram tables): the
// checkpoint leaves them unmapped.
bool is_streamed_tensor(std::string_view name);

// Errors: IoError when a shard cannot be opened for reading, ResourceExhausted when a slab cannot
// be allocated, InvalidArgument for zero slots.
Result<std::unique_ptr<WeightSource>> make_streaming_source(const io::Checkpoint& ckpt, const WeightMap& map,
                                                            const ModelConfig& c, const LayerPlan& plan,
                                                            const StreamingOptions& options);

}  // namespace cedar::model
