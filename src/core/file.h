// Whole-file reads for small text inputs (configs, tokenizer files).
#pragma once

#include <string>

#include "core/status.h"

namespace cedar {

// The bytes of `path`. A directory, a missing file or a read error is an error naming the path.
Result<std::string> read_whole_file(const std::string& path);

}  // namespace cedar
