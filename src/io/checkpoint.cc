#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

namespace cedar::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxIndexBytes = 100'000'000;

// Error lists name at most this many items, then "... and N more".
constexpr size_t kMaxListed = 20;

std::string join_limited(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  if (items.size() > kMaxListed) out += ", ... and " + std::to_string(items.size() - kMaxListed) + " more";
  return out;
}

// A shard name from the index must name a file directly inside the checkpoint directory.
// Symlinks are fine (the Hugging Face cache links shards to blobs); path components are not.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

struct Index {
  std::map<std::string, std::vector<std::string>> tensors_by_shard;  // shard -> tensor names
  std::optional<uint64_t> total_size;
  size_t tensor_count = 0;
};

Result<Index> read_index(const std::string& index_path) {
  CEDAR_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(index_path));
  // The V4.1 index (96k tensors) is about 6 MB; a much larger one is not an index.
  if (mapped.size() > kMaxIndexBytes)
    return data_loss(index_path + ": " + std::to_string(mapped.size()) + " bytes, over the " +
                     std::to_string(kMaxIndexBytes) + "-byte limit for an index; the file is corrupt");
  const auto* text = reinterpret_cast<const char*>(mapped.data());
  json root;
  try {
    root = json::parse(text, text + mapped.size());
  } catch (const json::exception& e) {
    return data_loss(index_path + ": not valid JSON (" + e.what() + "); re-download the index");
  }
  if (!root.is_object()) return data_loss(index_path + ": expected a JSON object");
  const auto map_it = root.find("weight_map");
  if (map_it == root.end() || !map_it->is_object())
    return data_loss(index_path + ": missing the \"weight_map\" object (tensor name -> shard file)");
  Index index;
  std::vector<std::string> traversal;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string())
      return data_loss(index_path + ": weight_map entry for tensor '" + name + "' is a JSON " +
                       shard.type_name() + ", expected a shard file name");
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (!is_plain_file_name(shard_name)) {
      traversal.push_back("'" + shard_name + "' (tensor '" + name + "')");
      continue;
    }
    index.tensors_by_shard[shard_name].push_back(name);
    ++index.tensor_count;
  }
  // Sorted, so that shard cross-checks can binary-search.
  for (auto& [shard, names] : index.tensors_by_shard) std::sort(names.begin(), names.end());
  if (!traversal.empty())
    return data_loss(index_path + ": shard names must be plain file names inside the checkpoint "
                     "directory, refusing " + join_limited(traversal));
  const auto meta_it = root.find("metadata");
  if (meta_it != root.end() && meta_it->is_object()) {
    const auto total_it = meta_it->find("total_size");
    if (total_it != meta_it->end() && total_it->is_number_unsigned())
      index.total_size = total_it->get<uint64_t>();
  }
  return index;
}

// Reads every tensor byte of `shard` with pread, so that an unreadable sector is an error here
// rather than a SIGBUS later through the mapping.
Status read_shard_data(const SafetensorsFile& shard, const std::string& shard_name,
                       CheckpointProgress* progress,
                       const std::function<void(const CheckpointProgress&)>& report) {
  constexpr size_t kChunk = 8u << 20;
  constexpr uint64_t kReportEvery = 64u << 20;
  const int fd = ::open(shard.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open " + shard.path(), errno);
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint8_t> buffer(kChunk);
  uint64_t since_report = 0;
  Status st;
  for (const TensorView& t : shard.tensors()) {
    uint64_t done = 0;
    while (st.ok() && done < t.nbytes) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, t.nbytes - done));
      const ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(t.file_offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        st = io_error(shard.path() + ": tensor '" + t.name + "': cannot read data", errno);
      } else if (n == 0) {
        st = data_loss(shard.path() + ": tensor '" + t.name +
                       "': file ended while reading (it shrank after opening)");
      } else {
        done += static_cast<uint64_t>(n);
        progress->bytes_done += static_cast<uint64_t>(n);
        since_report += static_cast<uint64_t>(n);
        if (report && since_report >= kReportEvery) {
          since_report = 0;
          progress->current_file = shard_name;
          report(*progress);
        }
      }
    }
    if (!st.ok()) break;
    ++progress->tensors_done;
  }
  ::close(fd);
  return st;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir, const CheckpointOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return not_found("checkpoint directory " + dir + " does not exist or is not a directory");
  const fs::path root(dir);
  const std::string index_path = (root / kIndexFileName).string();
  const std::string single_path = (root / kSingleFileName).string();

  Checkpoint ck;
  ck.dir_ = dir;
  std::optional<Index> index;
  std::vector<std::string> shard_names;
  if (fs::exists(index_path, ec)) {
    CEDAR_ASSIGN_OR_RETURN(index, read_index(index_path));
    ck.sharded_ = true;
    ck.index_total_size_ = index->total_size;
    std::vector<std::string> missing;
    for (const auto& [shard, names] : index->tensors_by_shard) {
      if (!fs::is_regular_file(root / shard, ec))
        missing.push_back("'" + shard + "' (holds '" + names.front() + "'" +
                          (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "") +
                          ")");
      shard_names.push_back(shard);
    }
    if (!missing.empty())
      return not_found("checkpoint " + dir + ": " + kIndexFileName + " lists shard file(s) that do "
                       "not exist (or are not regular files): " + join_limited(missing) +
                       "; the download is incomplete");
  } else if (fs::exists(single_path, ec)) {
    shard_names.push_back(kSingleFileName);
  } else {
    return not_found("checkpoint " + dir + ": found neither " + kIndexFileName + " nor " +
                     kSingleFileName + "; point at the directory holding the safetensors files");
  }

  CheckpointProgress progress;
  progress.shards_total = shard_names.size();
  progress.tensors_total = index ? index->tensor_count : 0;
  for (const std::string& shard : shard_names) {
    const uint64_t size = fs::file_size(root / shard, ec);
    if (!ec) progress.bytes_total += size;
  }

  ck.shards_.reserve(shard_names.size());
  std::vector<std::string> problems;
  for (const std::string& shard : shard_names) {
    CEDAR_ASSIGN_OR_RETURN(SafetensorsFile file, options.map_filter
                                                     ? SafetensorsFile::open((root / shard).string(), options.map_filter)
                                                     : SafetensorsFile::open((root / shard).string()));
    if (index) {
      // Both directions: every tensor the index places here exists, and nothing else is here.
      const std::vector<std::string>& expected = index->tensors_by_shard.at(shard);
      for (const std::string& name : expected)
        if (file.find(name) == nullptr)
          problems.push_back("tensor '" + name + "' is missing from shard " + shard);
      for (const TensorView& t : file.tensors())
        if (!std::binary_search(expected.begin(), expected.end(), t.name))
          problems.push_back("shard " + shard + " holds tensor '" + t.name +
                             "' that the index does not place there");
    } else {
      progress.tensors_total += file.tensors().size();
    }
    progress.shards_done += 1;
    progress.tensors_done += file.tensors().size();
    progress.bytes_done += file.file_size();
    progress.current_file = shard;
    ck.total_bytes_ += file.tensor_bytes();
    ck.shards_.push_back(std::move(file));
    if (options.progress) options.progress(progress);
  }
  if (!problems.empty())
    return data_loss("checkpoint " + dir + ": " + kIndexFileName + " and the shards disagree (" +
                     std::to_string(problems.size()) + " problem(s)): " + join_limited(problems) +
                     "; re-download the checkpoint");

  for (uint32_t s = 0; s < ck.shards_.size(); ++s)
    for (const TensorView& t : ck.shards_[s].tensors()) {
      ck.sorted_.push_back(&t);
      ck.sorted_shard_.push_back(s);
    }
  std::vector<uint32_t> order(ck.sorted_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return ck.sorted_[a]->name < ck.sorted_[b]->name; });
  std::vector<const TensorView*> views(order.size());
  std::vector<uint32_t> shard_of(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    views[i] = ck.sorted_[order[i]];
    shard_of[i] = ck.sorted_shard_[order[i]];
  }
  ck.sorted_ = std::move(views);
  ck.sorted_shard_ = std::move(shard_of);

  if (options.read_all_data) {
    progress = CheckpointProgress{};
    progress.phase = CheckpointProgress::Phase::kData;
    progress.shards_total = ck.shards_.size();
    progress.tensors_total = ck.sorted_.size();
    progress.bytes_total = ck.total_bytes_;
    for (size_t s = 0; s < ck.shards_.size(); ++s) {
      CEDAR_RETURN_IF_ERROR(read_shard_data(ck.shards_[s], shard_names[s], &progress, options.progress));
      progress.shards_done += 1;
      progress.current_file = shard_names[s];
      if (options.progress) options.progress(progress);
    }
  }
  return ck;
}

const TensorView* Checkpoint::find(std::string_view name) const {
  const auto it = std::lower_bound(sorted_.begin(), sorted_.end(), name,
                                   [](const TensorView* t, std::string_view n) { return t->name < n; });
  if (it == sorted_.end() || (*it)->name != name) return nullptr;
  return *it;
}

Result<const TensorView*> Checkpoint::require(std::string_view name) const {
  const TensorView* t = find(name);
  if (t == nullptr)
    return not_found("checkpoint " + dir_ + ": no tensor '" + std::string(name) +
                     "'; the checkpoint does not match the model config");
  return t;
}

std::vector<std::string> Checkpoint::shard_names() const {
  std::vector<std::string> names;
  for (const SafetensorsFile& s : shards_) names.push_back(fs::path(s.path()).filename().string());
  return names;
}

const SafetensorsFile* Checkpoint::shard_of(const TensorView& tensor) const {
  for (const SafetensorsFile& s : shards_) {
    const auto& ts = s.tensors();
    if (!ts.empty() && &tensor >= &ts.front() && &tensor <= &ts.back()) return &s;
  }
  return nullptr;
}

void Checkpoint::prefetch(const TensorView& tensor) const {
  if (const SafetensorsFile* s = shard_of(tensor)) s->prefetch(tensor);
}

void Checkpoint::drop(const TensorView& tensor) const {
  if (const SafetensorsFile* s = shard_of(tensor)) s->drop(tensor);
}

}  // namespace cedar::io
