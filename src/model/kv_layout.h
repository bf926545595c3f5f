// The KV cache's view of a model (kv::ModelKvSpec) read off the layer plan, and the model
// fingerprint that keys prefix hashes and disk files (a cache written by other weights never matches).
// Model::kv_geometry turns them into the one byte layout every sequence and the prefix cache use.
#pragma once

#include <cstdint>
#include <string>

#include "kv/geometry.h"
#include "spec/config.h"
#include "spec/layer_plan.h"

namespace cedar::io {
class Checkpoint;
}

namespace cedar::model {

kv::ModelKvSpec kv_spec_from_plan(const std::string& name, const ModelConfig& c, const LayerPlan& plan,
                                  uint64_t fingerprint);

// XXH3 over config.json and a sample of tensor bytes (the first 4 KiB of a few named tensors, all
// tensor names and shapes): cheap on a 511 GB checkpoint, different for different weights.
uint64_t model_fingerprint(const std::string& config_text, const io::Checkpoint& ckpt);

}  // namespace cedar::model
