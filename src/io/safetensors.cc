#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace cedar::io {
namespace {

using nlohmann::json;

// Dtypes the safetensors format defines that cedar does not load: a checkpoint using one is
// well-formed but unsupported (Unimplemented), unlike a made-up name (DataLoss).
constexpr std::string_view kForeignSafetensorsDtypes[] = {
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "I16", "U16", "U32", "U64", "F64", "C64",
};

// Tensor names come from the file: keep error messages printable and bounded.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > kMax) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string where(std::string_view file, std::string_view tensor) {
  return std::string(file) + ": tensor '" + printable(tensor) + "': ";
}

// The largest rank accepted; real checkpoints stop at 3, and the bound keeps a hostile shape array
// from costing memory.
constexpr size_t kMaxRank = 64;

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// One JSON value as the header parser keeps it: its kind and, for numbers, its value, plus the
// source text for error messages. Containers nested where a scalar belongs are not kept.
struct JsonItem {
  enum class Kind { kUnsigned, kNegative, kFloat, kString, kBool, kNull, kArray, kObject };
  Kind kind = Kind::kNull;
  uint64_t value = 0;  // kUnsigned only
  std::string text;    // "12", "-1", "1.5", "\"F32\"", "true", "null", "[...]", "{...}"

  const char* type_name() const {
    switch (kind) {
      case Kind::kUnsigned:
      case Kind::kNegative:
      case Kind::kFloat: return "number";
      case Kind::kString: return "string";
      case Kind::kBool: return "boolean";
      case Kind::kNull: return "null";
      case Kind::kArray: return "array";
      case Kind::kObject: return "object";
    }
    return "value";
  }
};

// A field of a tensor entry: absent, a single value, or an array of items.
struct RawField {
  bool present = false;
  JsonItem value;               // the value itself; kind kArray when it is an array
  std::vector<JsonItem> items;  // array elements, at most kMaxRank + 1 kept
  size_t item_count = 0;        // all elements, kept or not

  std::string array_text() const {
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i].text;
    if (item_count > items.size()) out += ",...";
    return out + "]";
  }
};

struct RawEntry {
  std::string name;
  RawField dtype, shape, offsets;
};

Result<SafetensorsEntry> validate_entry(const RawEntry& raw, std::string_view file, uint64_t data_size) {
  const std::string at = where(file, raw.name);
  SafetensorsEntry e;
  e.name = raw.name;

  if (!raw.dtype.present) return data_loss(at + "missing \"dtype\"");
  if (raw.dtype.value.kind != JsonItem::Kind::kString) return data_loss(at + "\"dtype\" is not a string");
  const std::string& dtype_text = raw.dtype.value.text;  // unquoted for strings
  const std::optional<Dtype> dtype = parse_dtype(dtype_text);
  if (!dtype) {
    for (std::string_view foreign : kForeignSafetensorsDtypes)
      if (dtype_text == foreign)
        return unimplemented(at + "dtype " + dtype_text +
                             " is valid safetensors but not supported by cedar (supported: BF16, "
                             "F16, F32, F8_E4M3, F8_E8M0, I8, U8, I32, I64); convert the checkpoint");
    return data_loss(at + "unknown dtype '" + printable(dtype_text) +
                     "'; the header is corrupt or from an incompatible writer");
  }
  e.dtype = *dtype;

  if (!raw.shape.present) return data_loss(at + "missing \"shape\"");
  if (raw.shape.value.kind != JsonItem::Kind::kArray) return data_loss(at + "\"shape\" is not an array");
  if (raw.shape.item_count > kMaxRank)
    return data_loss(at + "shape has " + std::to_string(raw.shape.item_count) + " dimensions, more than " +
                     std::to_string(kMaxRank) + "; the header is corrupt");
  // numel and the byte size are computed in 64 bits with overflow checks; both must also fit
  // the int64_t shape convention and size_t.
  uint64_t numel = 1;
  bool overflow = false;
  bool has_zero_dim = false;
  for (size_t d = 0; d < raw.shape.items.size(); ++d) {
    const JsonItem& item = raw.shape.items[d];
    if (item.kind != JsonItem::Kind::kUnsigned || item.value > static_cast<uint64_t>(INT64_MAX))
      return data_loss(at + "shape[" + std::to_string(d) + "] = " + item.text +
                       " is not a non-negative integer");
    const uint64_t dim = item.value;
    e.shape.push_back(static_cast<int64_t>(dim));
    if (dim == 0) has_zero_dim = true;
    if (overflow || has_zero_dim) continue;  // numel is no longer tracked exactly
    if (numel > static_cast<uint64_t>(INT64_MAX) / dim) overflow = true;
    numel *= dim;
  }
  // A zero dimension makes any product empty, however large the other dimensions.
  if (has_zero_dim) {
    numel = 0;
    overflow = false;
  }
  const uint64_t elem = dtype_size(e.dtype);
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / elem ||
      numel * elem > std::numeric_limits<size_t>::max())
    return data_loss(at + "shape " + raw.shape.array_text() + " overflows 64-bit byte size");
  const uint64_t nbytes = numel * elem;

  const RawField& offs = raw.offsets;
  if (!offs.present) return data_loss(at + "missing \"data_offsets\"");
  if (offs.value.kind != JsonItem::Kind::kArray || offs.item_count != 2 ||
      offs.items[0].kind != JsonItem::Kind::kUnsigned || offs.items[1].kind != JsonItem::Kind::kUnsigned)
    return data_loss(at + "\"data_offsets\" " +
                     (offs.value.kind == JsonItem::Kind::kArray ? offs.array_text() : offs.value.text) +
                     " is not a pair of non-negative integers [begin, end]");
  e.begin = offs.items[0].value;
  e.end = offs.items[1].value;
  const std::string range = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) return data_loss(at + range + " end before begin; the header is corrupt");
  if (e.end - e.begin != nbytes)
    return data_loss(at + range + " span " + std::to_string(e.end - e.begin) + " bytes but " +
                     dtype_name(e.dtype) + " shape " + raw.shape.array_text() + " needs " +
                     std::to_string(nbytes) + "; the header is corrupt");
  if (e.end > data_size)
    return data_loss(at + range + " run past the end of the data section (" + std::to_string(data_size) +
                     " bytes): the file is truncated (re-download or re-copy it)");
  return e;
}

// Streams the header through nlohmann's SAX interface and keeps only what the format defines, so
// memory stays proportional to the number of tensors and no input nests the parser's own stack
// (nlohmann's SAX parser is iterative; skipped containers are only counted). Each tensor entry is
// validated as soon as it closes; the first problem stops the parse.
class HeaderSax : public nlohmann::json_sax<json> {
 public:
  HeaderSax(std::string_view file, uint64_t data_size, SafetensorsHeader* out)
      : file_(file), data_size_(data_size), out_(out) {}

  const Status& status() const { return status_; }
  // Root keys in file order ("__metadata__" included), for the duplicate check.
  std::vector<std::string>& keys() { return keys_; }

  bool null() override { return scalar({JsonItem::Kind::kNull, 0, "null"}); }
  bool boolean(bool v) override { return scalar({JsonItem::Kind::kBool, 0, v ? "true" : "false"}); }
  bool number_integer(number_integer_t v) override {
    // nlohmann reports non-negative integers through number_unsigned; this one is negative.
    return scalar({JsonItem::Kind::kNegative, 0, std::to_string(v)});
  }
  bool number_unsigned(number_unsigned_t v) override {
    return scalar({JsonItem::Kind::kUnsigned, v, std::to_string(v)});
  }
  bool number_float(number_float_t, const string_t& text) override {
    return scalar({JsonItem::Kind::kFloat, 0, text});
  }
  bool string(string_t& v) override {
    // Kept unquoted: dtype names and metadata values are used as they are.
    return scalar({JsonItem::Kind::kString, 0, v});
  }
  bool binary(binary_t&) override { return scalar({JsonItem::Kind::kNull, 0, "binary"}); }

  bool start_object(std::size_t) override { return open(JsonItem::Kind::kObject); }
  bool start_array(std::size_t) override { return open(JsonItem::Kind::kArray); }

  bool key(string_t& k) override {
    switch (ctx_) {
      case Ctx::kRoot:
        keys_.push_back(k);
        root_key_ = k;
        return true;
      case Ctx::kMetadata:
      case Ctx::kEntry:
        field_ = k;
        return true;
      case Ctx::kSkip: return true;
      default: return fail(internal_error("unexpected JSON key"));
    }
  }

  bool end_object() override {
    switch (ctx_) {
      case Ctx::kSkip: return close_skipped();
      case Ctx::kMetadata: ctx_ = Ctx::kRoot; return true;
      case Ctx::kEntry: {
        ctx_ = Ctx::kRoot;
        auto entry = validate_entry(entry_, file_, data_size_);
        if (!entry.ok()) return fail(entry.status());
        out_->tensors.push_back(std::move(entry).value());
        return true;
      }
      case Ctx::kRoot: ctx_ = Ctx::kDone; return true;
      default: return fail(internal_error("unexpected end of JSON object"));
    }
  }

  bool end_array() override {
    switch (ctx_) {
      case Ctx::kSkip: return close_skipped();
      case Ctx::kArrayField: ctx_ = Ctx::kEntry; return true;
      default: return fail(internal_error("unexpected end of JSON array"));
    }
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    return fail(data_loss(std::string(file_) + ": header is not valid JSON (" + ex.what() +
                          "); the file is corrupt or not a safetensors file"));
  }

 private:
  enum class Ctx { kTop, kRoot, kMetadata, kEntry, kArrayField, kSkip, kDone };

  bool fail(Status st) {
    if (status_.ok()) status_ = std::move(st);
    return false;
  }

  // A value that is a container: either a context we understand or one to skip.
  bool open(JsonItem::Kind kind) {
    const bool is_object = kind == JsonItem::Kind::kObject;
    const JsonItem item{kind, 0, is_object ? "{...}" : "[...]"};
    switch (ctx_) {
      case Ctx::kTop:
        if (!is_object) return not_an_object(item);
        ctx_ = Ctx::kRoot;
        return true;
      case Ctx::kRoot:
        if (root_key_ == "__metadata__") {
          if (!is_object) return bad_metadata(item);
          ctx_ = Ctx::kMetadata;
          return true;
        }
        if (!is_object)
          return fail(data_loss(where(file_, root_key_) + "header entry is a JSON " + item.type_name() +
                                ", expected an object with dtype, shape and data_offsets"));
        entry_ = RawEntry{};
        entry_.name = root_key_;
        ctx_ = Ctx::kEntry;
        return true;
      case Ctx::kMetadata: return bad_metadata_value(item);
      case Ctx::kEntry: {
        RawField* f = entry_field();
        if (f != nullptr) {
          *f = RawField{true, item, {}, 0};
          if (!is_object && f != &entry_.dtype) {
            ctx_ = Ctx::kArrayField;
            return true;
          }
        }
        return skip(Ctx::kEntry);  // unknown fields are ignored, as the reference reader does
      }
      case Ctx::kArrayField:
        add_item(item);
        return skip(Ctx::kArrayField);
      case Ctx::kSkip: ++skip_depth_; return true;
      default: return fail(internal_error("unexpected JSON value"));
    }
  }

  bool scalar(JsonItem item) {
    switch (ctx_) {
      case Ctx::kTop: return not_an_object(item);
      case Ctx::kRoot:
        if (root_key_ == "__metadata__") return bad_metadata(item);
        return fail(data_loss(where(file_, root_key_) + "header entry is a JSON " + item.type_name() +
                              ", expected an object with dtype, shape and data_offsets"));
      case Ctx::kMetadata:
        if (item.kind != JsonItem::Kind::kString) return bad_metadata_value(item);
        out_->metadata[field_] = std::move(item.text);
        return true;
      case Ctx::kEntry:
        if (RawField* f = entry_field()) *f = RawField{true, std::move(item), {}, 0};
        return true;
      case Ctx::kArrayField: add_item(std::move(item)); return true;
      case Ctx::kSkip: return true;
      default: return fail(internal_error("unexpected JSON value"));
    }
  }

  RawField* entry_field() {
    if (field_ == "dtype") return &entry_.dtype;
    if (field_ == "shape") return &entry_.shape;
    if (field_ == "data_offsets") return &entry_.offsets;
    return nullptr;
  }

  void add_item(JsonItem item) {
    RawField* f = entry_field();
    if (f->items.size() <= kMaxRank) f->items.push_back(std::move(item));
    ++f->item_count;
  }

  bool skip(Ctx return_to) {
    skip_return_ = return_to;
    skip_depth_ = 1;
    ctx_ = Ctx::kSkip;
    return true;
  }

  bool close_skipped() {
    if (--skip_depth_ == 0) ctx_ = skip_return_;
    return true;
  }

  bool not_an_object(const JsonItem& item) {
    return fail(data_loss(std::string(file_) + ": header is a JSON " + item.type_name() +
                          ", expected an object; the file is corrupt or not a safetensors file"));
  }
  bool bad_metadata(const JsonItem& item) {
    return fail(data_loss(std::string(file_) + ": \"__metadata__\" is a JSON " + item.type_name() +
                          ", expected an object of strings; the header is corrupt"));
  }
  bool bad_metadata_value(const JsonItem& item) {
    return fail(data_loss(std::string(file_) + ": \"__metadata__\" key '" + printable(field_) +
                          "' is a JSON " + item.type_name() + ", expected a string; the header is corrupt"));
  }

  std::string_view file_;
  uint64_t data_size_;
  SafetensorsHeader* out_;
  Status status_;
  Ctx ctx_ = Ctx::kTop;
  Ctx skip_return_ = Ctx::kTop;
  size_t skip_depth_ = 0;
  std::string root_key_;
  std::string field_;
  RawEntry entry_;
  std::vector<std::string> keys_;
};

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                                   std::string_view file_label) {
  return parse_safetensors_header(file_bytes, file_bytes.size(), file_label);
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> head, uint64_t file_size,
                                                   std::string_view file_label) {
  const std::string file(file_label);
  const uint64_t size = file_size;
  const std::span<const uint8_t> file_bytes = head;
  if (size < 8)
    return data_loss(file + ": file is " + std::to_string(size) +
                     " bytes, shorter than the 8-byte header length; it is truncated or not a "
                     "safetensors file");
  SafetensorsHeader h;
  h.header_bytes = read_le64(file_bytes.data());
  if (h.header_bytes > kMaxSafetensorsHeaderBytes)
    return data_loss(file + ": header length " + std::to_string(h.header_bytes) + " exceeds the " +
                     std::to_string(kMaxSafetensorsHeaderBytes) +
                     "-byte limit; the file is corrupt or not a safetensors file");
  if (h.header_bytes > size - 8)
    return data_loss(file + ": header length " + std::to_string(h.header_bytes) +
                     " runs past the end of the file (" + std::to_string(size) +
                     " bytes); the file is truncated (re-download or re-copy it)");
  h.data_offset = 8 + h.header_bytes;
  const uint64_t data_size = size - h.data_offset;
  CEDAR_CHECK(file_bytes.size() >= h.data_offset, "%s: header bytes not supplied", file.c_str());

  const auto* text = reinterpret_cast<const char*>(file_bytes.data() + 8);
  HeaderSax sax(file, data_size, &h);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text, text + h.header_bytes, &sax);
  } catch (const std::exception& e) {  // allocation failure or a library invariant
    return data_loss(file + ": cannot parse the header (" + e.what() + ")");
  }
  if (!parsed) {
    if (!sax.status().ok()) return sax.status();
    return data_loss(file + ": header is not valid JSON; the file is corrupt");
  }

  // A name given twice would silently lose one of the two tensors.
  std::vector<std::string>& keys = sax.keys();
  std::sort(keys.begin(), keys.end());
  const auto dup = std::adjacent_find(keys.begin(), keys.end());
  if (dup != keys.end()) return data_loss(where(file, *dup) + "appears twice in the header; the file is corrupt");

  // Data order; then no two non-empty ranges may share a byte. Empty tensors own no bytes.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin == e.end) continue;
    if (prev != nullptr && e.begin < prev->end)
      return data_loss(where(file, e.name) + "data_offsets [" + std::to_string(e.begin) + ", " +
                       std::to_string(e.end) + "] overlap tensor '" + printable(prev->name) + "' [" +
                       std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
                       "]; the header is corrupt");
    prev = &e;
  }
  return h;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  CEDAR_ASSIGN_OR_RETURN(f.mapping_, MappedFile::open(path));
  f.path_ = path;
  f.file_size_ = f.mapping_.size();
  CEDAR_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors_header(f.mapping_.bytes(), path));
  CEDAR_RETURN_IF_ERROR(f.bind(std::move(header), nullptr));
  return f;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path, const TensorFilter& keep) {
  SafetensorsFile f;
  f.path_ = path;
  std::vector<uint8_t> head;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error("cannot open " + path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd);
      return err ? io_error("cannot stat " + path, err) : invalid_argument(path + " is not a regular file");
    }
    f.file_size_ = static_cast<uint64_t>(st.st_size);
    // The 8-byte length, then the header it announces (clamped: the parser reports a bad length).
    head.resize(static_cast<size_t>(std::min<uint64_t>(f.file_size_, 8)));
    uint64_t want = head.size();
    for (int pass = 0; pass < 2; ++pass) {
      head.resize(static_cast<size_t>(want));
      for (uint64_t got = 0; got < want;) {
        const ssize_t n = ::pread(fd, head.data() + got, want - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int err = n < 0 ? errno : EIO;
          ::close(fd);
          return io_error("cannot read the header of " + path, err);
        }
        got += static_cast<uint64_t>(n);
      }
      if (pass == 0 && want == 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
        want = 8 + std::min({n, kMaxSafetensorsHeaderBytes, f.file_size_ - 8});
      }
    }
    ::close(fd);
  }
  CEDAR_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors_header(head, f.file_size_, path));
  CEDAR_RETURN_IF_ERROR(f.bind(std::move(header), &keep));
  return f;
}

Status SafetensorsFile::bind(SafetensorsHeader header, const TensorFilter* keep) {
  data_offset_ = header.data_offset;
  metadata_ = std::move(header.metadata);
  tensors_.reserve(header.tensors.size());
  for (SafetensorsEntry& e : header.tensors) {
    TensorView v;
    v.name = std::move(e.name);
    v.dtype = e.dtype;
    v.shape = std::move(e.shape);
    v.file_offset = header.data_offset + e.begin;
    v.nbytes = static_cast<size_t>(e.end - e.begin);
    // In range: end <= file size, checked by the parser. Filtered files bind below.
    v.data = keep ? nullptr : mapping_.data() + v.file_offset;
    v.file = path_;
    tensor_bytes_ += v.nbytes;
    tensors_.push_back(std::move(v));
  }
  if (keep) {
    // tensors_ is in data order: map each maximal run of kept tensors once.
    for (size_t i = 0; i < tensors_.size();) {
      if (!(*keep)(tensors_[i].name)) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      uint64_t end = tensors_[i].file_offset + tensors_[i].nbytes;
      while (j < tensors_.size() && (*keep)(tensors_[j].name)) {
        end = std::max<uint64_t>(end, tensors_[j].file_offset + tensors_[j].nbytes);
        ++j;
      }
      CEDAR_ASSIGN_OR_RETURN(MappedFile w, MappedFile::open_range(path_, tensors_[i].file_offset,
                                                                  end - tensors_[i].file_offset));
      for (size_t k = i; k < j; ++k) tensors_[k].data = w.data() + (tensors_[k].file_offset - w.offset());
      windows_.push_back(std::move(w));
      i = j;
    }
  }
  by_name_.resize(tensors_.size());
  for (uint32_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(), [&](uint32_t a, uint32_t b) { return tensors_[a].name < tensors_[b].name; });
  return {};
}

const MappedFile* SafetensorsFile::window_of(const TensorView& tensor) const {
  if (windows_.empty()) return &mapping_;
  for (const MappedFile& w : windows_)
    if (tensor.data != nullptr && w.contains(tensor.data, tensor.nbytes)) return &w;
  return nullptr;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

void SafetensorsFile::prefetch(const TensorView& tensor) const {
  if (const MappedFile* m = window_of(tensor)) m->prefetch(tensor.file_offset, tensor.nbytes);
}

void SafetensorsFile::drop(const TensorView& tensor) const {
  if (const MappedFile* m = window_of(tensor)) m->drop(tensor.file_offset, tensor.nbytes);
}

}  // namespace cedar::io
