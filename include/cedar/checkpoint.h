// cedar's public API for front ends (tools/): checkpoint files. io::Checkpoint (a folder of
// safetensors shards, validated) and model::write_tiny_checkpoint (random weights in the released
// layout, `cedar make-tiny`).
#pragma once

#include "io/checkpoint.h"
#include "tiny/tiny_checkpoint.h"
