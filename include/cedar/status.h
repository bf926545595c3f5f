// cedar's public API for front ends (tools/): errors as values. Status and Result<T> are the types
// every public call returns; their home is core/status.h.
#pragma once

#include "core/status.h"
