// SafetensorsWriter: the exact bytes it lays out (hand-worked and against the reference Python
// writer), round trips through the reader for every dtype, argument checks, full-disk handling and
// atomic replacement, and the index file.
#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace cedar::io {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// The oracle sample; tools/oracles/safetensors_oracle.py defines the same list (SAMPLE). Insertion
// order is deliberately neither sorted nor size-aligned: odd byte counts leave later tensors
// unaligned, which the format allows.
struct SampleTensor {
  const char* name;
  Dtype dtype;
  std::vector<int64_t> shape;
  uint8_t seed;  // bytes are seed, seed + 1, ...
};
const std::vector<SampleTensor>& sample() {
  static const std::vector<SampleTensor> kSample = {
      {"layers.0.ffn.experts.3.w1.weight", Dtype::kI8, {2, 3}, 1},
      {"layers.0.ffn.experts.3.w1.scale", Dtype::kF8E8M0, {2, 1}, 17},
      {"embed.weight", Dtype::kBF16, {3, 2}, 33},
      {"layers.0.attn.wq_a.weight", Dtype::kF8E4M3, {2, 4}, 49},
      {"norm.weight", Dtype::kF32, {3}, 65},
      {"half", Dtype::kF16, {5}, 81},
      {"positions", Dtype::kI64, {2}, 97},
      {"ids", Dtype::kI32, {3}, 113},
      {"mask", Dtype::kU8, {1}, 129},
      {"empty", Dtype::kF32, {0, 3}, 145},
      {"scalar", Dtype::kF32, {}, 161},
  };
  return kSample;
}

size_t byte_size(Dtype dtype, const std::vector<int64_t>& shape) {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

SafetensorsWriter sample_writer() {
  SafetensorsWriter w;
  for (const SampleTensor& t : sample())
    EXPECT_TRUE(w.add(t.name, t.dtype, t.shape, testing::pattern(byte_size(t.dtype, t.shape), t.seed)).ok());
  w.set_metadata("producer", "cedar io test");
  w.set_metadata("format", "pt");
  return w;
}

// The oracle's listing format: metadata lines, then `name DTYPE [shape] hex` sorted by name.
std::string listing(const SafetensorsFile& f) {
  std::ostringstream out;
  for (const auto& [k, v] : f.metadata()) out << "__metadata__ " << k << "=" << v << "\n";
  std::vector<const TensorView*> views;
  for (const TensorView& t : f.tensors()) views.push_back(&t);
  std::sort(views.begin(), views.end(), [](auto* a, auto* b) { return a->name < b->name; });
  static const char kHex[] = "0123456789abcdef";
  for (const TensorView* t : views) {
    out << t->name << " " << dtype_name(t->dtype) << " [";
    for (size_t i = 0; i < t->shape.size(); ++i) out << (i ? "," : "") << t->shape[i];
    out << "] ";
    if (t->nbytes == 0) out << "-";
    for (size_t i = 0; i < t->nbytes; ++i) out << kHex[t->data[i] >> 4] << kHex[t->data[i] & 15];
    out << "\n";
  }
  return out.str();
}

std::string read_text(const std::string& path) {
  const auto bytes = testing::read_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

const std::string kData = CEDAR_SOURCE_DIR "/tests/io/data/";

TEST(SafetensorsWriter, LaysOutAHandWorkedFile) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  const float one = 1.0f;
  ASSERT_TRUE(w.add_f32("a", {1}, std::span<const float>(&one, 1)).ok());
  ASSERT_TRUE(w.write(dir.file("a.safetensors")).ok());
  // 54 bytes of JSON + 2 spaces = 56 = 0x38, so the data starts at 8 + 56 = 64.
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::vector<uint8_t> expected = {0x38, 0, 0, 0, 0, 0, 0, 0};
  expected.insert(expected.end(), header.begin(), header.end());
  expected.insert(expected.end(), {' ', ' ', 0x00, 0x00, 0x80, 0x3F});  // 1.0f little-endian
  EXPECT_EQ(testing::read_bytes(dir.file("a.safetensors")), expected);
  EXPECT_EQ(w.header_json(), header + "  ");
}

TEST(SafetensorsWriter, RoundTripsEveryDtypeInInsertionOrder) {
  testing::ScratchDir dir;
  const SafetensorsWriter w = sample_writer();
  EXPECT_EQ(w.tensor_count(), sample().size());
  ASSERT_TRUE(w.write(dir.file("s.safetensors")).ok());
  auto f = SafetensorsFile::open(dir.file("s.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->data_offset() % 8, 0u);
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("producer"), "cedar io test");
  ASSERT_EQ(f->tensors().size(), sample().size());
  uint64_t offset = f->data_offset();
  size_t non_empty = 0;
  for (const SampleTensor& t : sample()) {
    const TensorView* v = f->find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(v->data, v->data + v->nbytes),
              testing::pattern(byte_size(t.dtype, t.shape), t.seed))
        << t.name;
    // Back to back in insertion order.
    EXPECT_EQ(v->file_offset, offset) << t.name;
    offset += v->nbytes;
    non_empty += v->nbytes > 0;
  }
  EXPECT_EQ(offset, f->file_size());
  EXPECT_EQ(f->tensor_bytes(), w.data_bytes());
  EXPECT_EQ(non_empty, sample().size() - 1);
}

TEST(SafetensorsWriter, RefusesBadTensors) {
  SafetensorsWriter w;
  const std::vector<uint8_t> four(4);
  const auto code = [](const Status& s) { return s.code(); };
  EXPECT_EQ(code(w.add("", Dtype::kF32, {1}, four)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(w.add("__metadata__", Dtype::kF32, {1}, four)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(w.add("neg", Dtype::kU8, {-4}, four)), StatusCode::kInvalidArgument);
  const Status mismatch = w.add("m", Dtype::kF32, {2}, four);
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.message(), HasSubstr("tensor 'm' is F32 with 2 elements (8 bytes) but 4"));
  EXPECT_EQ(code(w.add("big", Dtype::kI64, {int64_t{1} << 62, 8}, four)), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.add("ok", Dtype::kF32, {1}, four).ok());
  const Status dup = w.add("ok", Dtype::kU8, {4}, four);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("added twice"));
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(SafetensorsWriter, FullDiskIsResourceExhaustedNamingTheFile) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "/dev/full is not available here";
  const std::vector<uint8_t> bytes(4096, 1);
  const Status st = detail::write_fully(fd, bytes.data(), bytes.size(), "/models/x.safetensors");
  ::close(fd);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("/models/x.safetensors"));
  EXPECT_THAT(st.message(), HasSubstr("No space left on device"));
}

TEST(SafetensorsWriter, AFailedWriteLeavesTheOldFileAndNoTempFile) {
  testing::ScratchDir dir;
  const std::string path = dir.file("keep.safetensors");
  SafetensorsWriter small;
  ASSERT_TRUE(small.add("a", Dtype::kU8, {3}, testing::pattern(3, 5)).ok());
  ASSERT_TRUE(small.write(path).ok());
  const std::vector<uint8_t> before = testing::read_bytes(path);

  SafetensorsWriter big;
  ASSERT_TRUE(big.add("b", Dtype::kU8, {1 << 20}, std::vector<uint8_t>(1 << 20, 7)).ok());
  // A 64 KiB file size limit makes the write fail with EFBIG part way through (SIGXFSZ ignored
  // so the process sees the error instead of dying); the limit is restored right after.
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit low = old_limit;
  low.rlim_cur = 64 << 10;
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  const Status st = big.write(path);
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);

  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(path));
  EXPECT_EQ(testing::read_bytes(path), before);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u) << "the temp file was left behind";
  // And a successful write replaces the file.
  ASSERT_TRUE(big.write(path).ok());
  EXPECT_EQ(fs::file_size(path), 8 + big.header_json().size() + (1u << 20));
}

TEST(SafetensorsWriter, MissingDirectoryIsAnIoErrorNamingThePath) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  const Status st = w.write(dir.file("no/such/dir/x.safetensors"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_THAT(st.message(), HasSubstr("x.safetensors"));
  EXPECT_THAT(st.message(), HasSubstr("No such file or directory"));
}

TEST(WriteIndexJson, WritesTheHuggingFaceLayout) {
  testing::ScratchDir dir;
  ASSERT_TRUE(write_index_json(dir.path(), 1234,
                               {{"b.weight", "model-00002-of-00002.safetensors"},
                                {"a.weight", "model-00001-of-00002.safetensors"}})
                  .ok());
  const auto j = nlohmann::json::parse(read_text(dir.file(kIndexFileName)));
  EXPECT_EQ(j, nlohmann::json::parse(R"({"metadata":{"total_size":1234},"weight_map":{
      "a.weight":"model-00001-of-00002.safetensors",
      "b.weight":"model-00002-of-00002.safetensors"}})"));
}

TEST(WriteIndexJson, RefusesShardNamesThatLeaveTheDirectory) {
  testing::ScratchDir dir;
  for (const char* shard : {"../x.safetensors", "sub/x.safetensors", "/abs.safetensors", "..", ".", ""}) {
    const Status st = write_index_json(dir.path(), 0, {{"t", shard}});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << shard;
    EXPECT_THAT(st.message(), HasSubstr("tensor 't'")) << shard;
  }
  EXPECT_FALSE(fs::exists(dir.file(kIndexFileName)));
}

// ---- The reference Python implementation as oracle (tools/oracles/safetensors_oracle.py) ----

TEST(PythonOracle, ReaderAgreesWithTheReferenceOnAReferenceWrittenFile) {
  auto f = SafetensorsFile::open(kData + "python_written.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(listing(*f), read_text(kData + "python_written.listing.txt"));
}

TEST(PythonOracle, WriterReproducesTheReferenceWriterByteForByte) {
  // The reference orders tensors its own way; added in that (data) order, cedar's writer must
  // produce the identical file: same header text, same padding, same layout.
  const std::string ref_path = kData + "python_written.safetensors";
  auto ref = SafetensorsFile::open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  SafetensorsWriter w;
  for (const TensorView& t : ref->tensors()) ASSERT_TRUE(w.add(t.name, t.dtype, t.shape, t.bytes()).ok());
  testing::ScratchDir dir;
  ASSERT_TRUE(w.write(dir.file("again.safetensors")).ok());
  EXPECT_EQ(testing::read_bytes(dir.file("again.safetensors")), testing::read_bytes(ref_path));
}

TEST(PythonOracle, ReferenceReadsWhatTheWriterWrites) {
  // Written to the build tree on every run; tools/oracles/regen_io_oracle.sh lets the reference
  // read it and commits both the file and the reference's listing. The writer must still produce
  // that very file, so the reference's verdict still holds.
  const std::string out_dir = CEDAR_BINARY_DIR "/tests/io";
  fs::create_directories(out_dir);
  const std::string out = out_dir + "/cedar_written.safetensors";
  ASSERT_TRUE(sample_writer().write(out).ok());
  EXPECT_EQ(testing::read_bytes(out), testing::read_bytes(kData + "cedar_written.safetensors"));
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(listing(*f), read_text(kData + "cedar_written.listing.txt"));
}

}  // namespace
}  // namespace cedar::io
