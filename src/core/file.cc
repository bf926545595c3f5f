#include "core/file.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cedar {

Result<std::string> read_whole_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return invalid_argument(path + " is a directory; expected a file (e.g. " + path + "/tokenizer.json)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path + ": check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("reading " + path, errno);
  return ss.str();
}

}  // namespace cedar
