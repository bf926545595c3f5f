#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"

namespace cedar::io {
namespace {

using ordered_json = nlohmann::ordered_json;

Status check_tensor(const std::string& name, Dtype dtype, const std::vector<int64_t>& shape,
                    size_t nbytes) {
  if (name.empty()) return invalid_argument("safetensors writer: empty tensor name");
  if (name == "__metadata__")
    return invalid_argument("safetensors writer: '__metadata__' is reserved, not a tensor name");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return invalid_argument("safetensors writer: tensor '" + name + "' has a negative dimension");
    if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      return invalid_argument("safetensors writer: tensor '" + name + "' shape overflows");
    numel *= static_cast<uint64_t>(d);
  }
  if (numel > std::numeric_limits<uint64_t>::max() / dtype_size(dtype) ||
      numel * dtype_size(dtype) != nbytes)
    return invalid_argument("safetensors writer: tensor '" + name + "' is " + dtype_name(dtype) +
                            " with " + std::to_string(numel) + " elements (" +
                            std::to_string(numel * dtype_size(dtype)) + " bytes) but " +
                            std::to_string(nbytes) + " bytes were given");
  return {};
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

Status close_fd(int fd, const std::string& path) {
  if (::close(fd) != 0) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT)
      return resource_exhausted("cannot write " + path + ": the disk is full (" +
                                std::strerror(err) + "); free space and retry");
    return io_error("cannot close " + path, err);
  }
  return {};
}

}  // namespace

namespace detail {

Status write_fully(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GiB per call; larger requests come back short and loop.
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == ENOSPC || err == EDQUOT || err == EFBIG)
        return resource_exhausted("cannot write " + path + ": " + std::strerror(err) +
                                  "; free disk space (or raise the quota / file size limit) "
                                  "and retry");
      return io_error("cannot write " + path, err);
    }
    if (n == 0) return io_error("cannot write " + path + " (write returned 0)", EIO);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

Status write_file_atomically(const std::string& path,
                             std::span<const std::span<const uint8_t>> chunks) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Unique per process and call, so concurrent writers of different files never collide.
  static std::atomic<uint64_t> counter{0};
  std::string tmp_name = ".";  // hidden, so a crash leaves no file that looks like a shard
  tmp_name += target.filename().string();
  tmp_name += ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  const std::string tmp = (dir / tmp_name).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create " + tmp + " (temp file for " + path + ")", errno);
  Status st;
  for (const auto& chunk : chunks) {
    st = write_fully(fd, chunk.data(), chunk.size(), path);
    if (!st.ok()) break;
  }
  if (st.ok() && ::fsync(fd) != 0) {
    const int err = errno;
    st = (err == ENOSPC || err == EDQUOT)
             ? resource_exhausted("cannot write " + path + ": the disk is full (" +
                                  std::strerror(err) + "); free space and retry")
             : io_error("cannot fsync " + tmp, err);
  }
  if (st.ok()) {
    st = close_fd(fd, path);
  } else {
    ::close(fd);
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = io_error("cannot rename " + tmp + " to " + path, errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  // Make the rename itself durable. A directory that cannot be opened or synced (some
  // filesystems refuse) does not undo a completed write, so this is best effort.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace detail

Status SafetensorsWriter::add(std::string name, Dtype dtype, std::vector<int64_t> shape,
                              std::span<const uint8_t> bytes) {
  return add(std::move(name), dtype, std::move(shape),
             std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

Status SafetensorsWriter::add(std::string name, Dtype dtype, std::vector<int64_t> shape,
                              std::vector<uint8_t>&& bytes) {
  CEDAR_RETURN_IF_ERROR(check_tensor(name, dtype, shape, bytes.size()));
  for (const Pending& t : tensors_)
    if (t.name == name)
      return invalid_argument("safetensors writer: tensor '" + name + "' added twice");
  data_bytes_ += bytes.size();
  tensors_.push_back({std::move(name), dtype, std::move(shape), std::move(bytes)});
  return {};
}

Status SafetensorsWriter::add_f32(std::string name, std::vector<int64_t> shape,
                                  std::span<const float> values) {
  // Safetensors is little-endian, as is every host cedar runs on.
  static_assert(std::endian::native == std::endian::little);
  std::vector<uint8_t> bytes(values.size_bytes());
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return add(std::move(name), Dtype::kF32, std::move(shape), std::move(bytes));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header_json() const {
  ordered_json header = ordered_json::object();
  if (!metadata_.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    ordered_json entry = ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    offset += t.bytes.size();
    header[t.name] = std::move(entry);
  }
  // Names are arbitrary bytes to the format; replace invalid UTF-8 rather than throw.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

Status SafetensorsWriter::write(const std::string& path) const {
  const std::string header = header_json();
  std::array<uint8_t, 8> prefix{};
  uint64_t n = header.size();
  for (auto& b : prefix) {
    b = static_cast<uint8_t>(n & 0xFF);
    n >>= 8;
  }
  std::vector<std::span<const uint8_t>> chunks;
  chunks.reserve(2 + tensors_.size());
  chunks.emplace_back(prefix.data(), prefix.size());
  chunks.emplace_back(reinterpret_cast<const uint8_t*>(header.data()), header.size());
  for (const Pending& t : tensors_) chunks.emplace_back(t.bytes.data(), t.bytes.size());
  return detail::write_file_atomically(path, chunks);
}

Status write_index_json(const std::string& dir, uint64_t total_size,
                        const std::map<std::string, std::string>& weight_map) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (const auto& [name, shard] : weight_map) {
    if (!is_plain_file_name(shard))
      return invalid_argument("index for " + dir + ": tensor '" + name + "' maps to shard '" +
                              shard + "', which is not a plain file name");
    map[name] = shard;
  }
  index["weight_map"] = std::move(map);
  const std::string text = index.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::span<const uint8_t> chunk(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return detail::write_file_atomically((std::filesystem::path(dir) / kIndexFileName).string(),
                                       std::span<const std::span<const uint8_t>>(&chunk, 1));
}

}  // namespace cedar::io
