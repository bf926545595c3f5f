#include "tokenizer/tokenizer_files.h"

#include <zstd.h>

#include <filesystem>

#include "core/file.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::tokenizer {
namespace {

// A tokenizer.json is a few MB; anything claiming far more is not one.
constexpr unsigned long long kMaxTokenizerBytes = 1ull << 30;

Result<std::string> decompress(const std::string& packed, const std::string& path) {
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || size > kMaxTokenizerBytes)
    return data_loss(path + " is not a zstd frame with a known size (compress it with `zstd`)");
  std::string out(size, '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) return data_loss("cannot decompress " + path + ": the file is damaged");
  return out;
}

}  // namespace

Result<TokenizerFiles> read_tokenizer_files(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerFiles files;
  std::error_code ec;
  const std::string plain = (fs::path(dir) / "tokenizer.json").string();
  const std::string packed = plain + ".zst";
  if (fs::exists(plain, ec)) {
    files.source = plain;
    CEDAR_ASSIGN_OR_RETURN(files.tokenizer_json, read_whole_file(plain));
  } else if (fs::exists(packed, ec)) {
    files.source = packed;
    CEDAR_ASSIGN_OR_RETURN(std::string bytes, read_whole_file(packed));
    CEDAR_ASSIGN_OR_RETURN(files.tokenizer_json, decompress(bytes, packed));
  } else {
    return not_found("no tokenizer.json (or tokenizer.json.zst) in " + dir);
  }
  const std::string config = (fs::path(dir) / "tokenizer_config.json").string();
  if (fs::exists(config, ec)) {
    CEDAR_ASSIGN_OR_RETURN(files.config_json, read_whole_file(config));
  }
  return files;
}

Result<std::unique_ptr<Tokenizer>> load_with_v41_markers(const std::string& dir) {
  CEDAR_ASSIGN_OR_RETURN(TokenizerFiles files, read_tokenizer_files(dir));
  CEDAR_ASSIGN_OR_RETURN(std::string v41, add_v41_markers(files.tokenizer_json));
  return Tokenizer::from_json(v41, files.config_json, files.source);
}

}  // namespace cedar::tokenizer
