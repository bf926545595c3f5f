// cedar's public API for front ends (tools/): a model loaded from a checkpoint folder.
// model::Model::load with its ModelOptions (numerics, KV dtype, residency: --memory-budget and the
// residency plan it reports).
#pragma once

#include "model/model.h"
#include "weights/residency_plan.h"
