// The safetensors header parser and SafetensorsFile against hand-built files: the valid shapes of
// the format and every hostile case the reader must refuse (each with its exact code and a
// message that names the file and the tensor).
#include "io/safetensors.h"

#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io_test_util.h"

namespace cedar::io {
namespace {

using ::testing::HasSubstr;
using testing::raw_safetensors;

constexpr const char* kLabel = "shard-7.safetensors";

Result<SafetensorsHeader> parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors_header(bytes, kLabel);
}

// A header for one tensor "t" with the given JSON fields, plus `data_len` zero bytes of data.
Result<SafetensorsHeader> parse_one(const std::string& fields, size_t data_len) {
  return parse(raw_safetensors("{\"t\":{" + fields + "}}", std::vector<uint8_t>(data_len)));
}

// The error must carry `code` and name the file and (when given) the tensor.
void expect_error(const Status& st, StatusCode code, const std::string& tensor,
                  const std::string& detail) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(kLabel));
  if (!tensor.empty()) {
    EXPECT_THAT(st.message(), HasSubstr("tensor '" + tensor + "'"));
  }
  EXPECT_THAT(st.message(), HasSubstr(detail));
}

TEST(SafetensorsHeader, ParsesAValidHeader) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
      R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  auto h = parse(raw_safetensors(header, std::vector<uint8_t>(28)));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->header_bytes, header.size());
  EXPECT_EQ(h->data_offset, 8 + header.size());
  EXPECT_EQ(h->metadata.at("format"), "pt");
  ASSERT_EQ(h->tensors.size(), 2u);
  // Data order, not key order.
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].dtype, Dtype::kF32);
  EXPECT_EQ(h->tensors[0].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(h->tensors[0].begin, 0u);
  EXPECT_EQ(h->tensors[0].end, 16u);
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].dtype, Dtype::kBF16);
  EXPECT_EQ(h->tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h->tensors[1].begin, 16u);
  EXPECT_EQ(h->tensors[1].end, 28u);
}

TEST(SafetensorsHeader, AcceptsEveryCedarDtypeWithItsSize) {
  // name, element bytes (from the safetensors format definition)
  const std::pair<const char*, size_t> dtypes[] = {
      {"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I8", 1},   {"U8", 1},  {"I32", 4}, {"I64", 8},
  };
  for (const auto& [name, size] : dtypes) {
    const size_t n = 3 * size;
    auto h = parse_one(std::string("\"dtype\":\"") + name + "\",\"shape\":[3],\"data_offsets\":[0," +
                           std::to_string(n) + "]",
                       n);
    ASSERT_TRUE(h.ok()) << name << ": " << h.status().to_string();
    EXPECT_EQ(dtype_name(h->tensors[0].dtype), std::string(name));
  }
}

TEST(SafetensorsHeader, AcceptsScalarsEmptyTensorsGapsPaddingAndNoTensors) {
  // A scalar has shape [] and one element.
  EXPECT_TRUE(parse_one(R"("dtype":"F32","shape":[],"data_offsets":[0,4])", 4).ok());
  // A zero dimension: no bytes, and it may sit anywhere, even inside another tensor's range.
  auto h = parse(raw_safetensors(R"({"big":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                 R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                                 std::vector<uint8_t>(8)));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  // A gap between tensors and bytes after the last one (other writers pad).
  EXPECT_TRUE(parse(raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
                                    std::vector<uint8_t>(16)))
                  .ok());
  // Trailing spaces pad the header, as writers do for alignment.
  EXPECT_TRUE(parse(raw_safetensors("{}      ", {})).ok());
  auto empty = parse(raw_safetensors("{}", {}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->tensors.empty());
}

TEST(SafetensorsHeader, RefusesFilesShorterThanThePrefix) {
  for (size_t n = 0; n < 8; ++n)
    expect_error(parse(std::vector<uint8_t>(n)).status(), StatusCode::kDataLoss, "",
                 "shorter than the 8-byte header length");
}

TEST(SafetensorsHeader, RefusesHeaderLengthOverTheCap) {
  expect_error(parse(raw_safetensors(kMaxSafetensorsHeaderBytes + 1, "{}", {})).status(),
               StatusCode::kDataLoss, "", "exceeds the 100000000-byte limit");
  expect_error(parse(raw_safetensors(~uint64_t{0}, "{}", {})).status(), StatusCode::kDataLoss, "",
               "exceeds");
}

TEST(SafetensorsHeader, RefusesHeaderLengthPastTheEndOfTheFile) {
  expect_error(parse(raw_safetensors(1000, "{}", {})).status(), StatusCode::kDataLoss, "",
               "runs past the end of the file (10 bytes)");
  // One byte too long.
  expect_error(parse(raw_safetensors(3, "{}", {})).status(), StatusCode::kDataLoss, "", "truncated");
}

TEST(SafetensorsHeader, RefusesInvalidJson) {
  for (const char* text : {"", "{", R"({"t":)", R"({"t":{"dtype":"F32",}})", "{}x", "\xff\xfe"})
    expect_error(parse(raw_safetensors(text, {})).status(), StatusCode::kDataLoss, "",
                 "header is not valid JSON");
}

TEST(SafetensorsHeader, RefusesJsonThatIsNotAnObject) {
  for (const char* text : {"[1,2]", "\"str\"", "null", "42", "true"})
    expect_error(parse(raw_safetensors(text, {})).status(), StatusCode::kDataLoss, "",
                 "expected an object");
}

TEST(SafetensorsHeader, RefusesAnEntryThatIsNotAnObject) {
  expect_error(parse(raw_safetensors(R"({"t":[1]})", {})).status(), StatusCode::kDataLoss, "t",
               "header entry is a JSON array");
}

TEST(SafetensorsHeader, RefusesMissingFields) {
  expect_error(parse_one(R"("shape":[1],"data_offsets":[0,4])", 4).status(), StatusCode::kDataLoss,
               "t", "missing \"dtype\"");
  expect_error(parse_one(R"("dtype":"F32","data_offsets":[0,4])", 4).status(),
               StatusCode::kDataLoss, "t", "missing \"shape\"");
  expect_error(parse_one(R"("dtype":"F32","shape":[1])", 4).status(), StatusCode::kDataLoss, "t",
               "missing \"data_offsets\"");
}

TEST(SafetensorsHeader, RefusesUnknownDtypes) {
  expect_error(parse_one(R"("dtype":"Q7","shape":[1],"data_offsets":[0,1])", 1).status(),
               StatusCode::kDataLoss, "t", "unknown dtype 'Q7'");
  // Lower case is not the format's spelling.
  expect_error(parse_one(R"("dtype":"f32","shape":[1],"data_offsets":[0,4])", 4).status(),
               StatusCode::kDataLoss, "t", "unknown dtype 'f32'");
  expect_error(parse_one(R"("dtype":7,"shape":[1],"data_offsets":[0,1])", 1).status(),
               StatusCode::kDataLoss, "t", "\"dtype\" is not a string");
}

TEST(SafetensorsHeader, RefusesFormatDtypesThatCedarDoesNotSupport) {
  expect_error(parse_one(R"("dtype":"F64","shape":[1],"data_offsets":[0,8])", 8).status(),
               StatusCode::kUnimplemented, "t", "dtype F64 is valid safetensors but not supported");
  expect_error(parse_one(R"("dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1])", 1).status(),
               StatusCode::kUnimplemented, "t", "F8_E5M2");
}

TEST(SafetensorsHeader, RefusesBadShapes) {
  expect_error(parse_one(R"("dtype":"U8","shape":[-1],"data_offsets":[0,0])", 0).status(),
               StatusCode::kDataLoss, "t", "shape[0] = -1 is not a non-negative integer");
  expect_error(parse_one(R"("dtype":"U8","shape":[2,1.5],"data_offsets":[0,3])", 3).status(),
               StatusCode::kDataLoss, "t", "shape[1] = 1.5");
  expect_error(parse_one(R"("dtype":"U8","shape":["2"],"data_offsets":[0,2])", 2).status(),
               StatusCode::kDataLoss, "t", "shape[0]");
  expect_error(parse_one(R"("dtype":"U8","shape":2,"data_offsets":[0,2])", 2).status(),
               StatusCode::kDataLoss, "t", "\"shape\" is not an array");
  // 2^64 itself does not fit a JSON integer nlohmann keeps exact; 2^63 does not fit int64_t.
  expect_error(
      parse_one(R"("dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0])", 0).status(),
      StatusCode::kDataLoss, "t", "shape[0]");
}

TEST(SafetensorsHeader, RefusesShapesWhoseByteSizeOverflows) {
  // 2^32 * 2^32 elements overflows 64 bits.
  expect_error(parse_one(R"("dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0])", 0)
                   .status(),
               StatusCode::kDataLoss, "t", "overflows 64-bit byte size");
  // 2^62 elements fit, but 2^62 * 8 bytes does not.
  expect_error(
      parse_one(R"("dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0])", 0).status(),
      StatusCode::kDataLoss, "t", "overflows");
  // A zero dimension makes even a huge product empty, not an overflow.
  EXPECT_TRUE(
      parse_one(R"("dtype":"I64","shape":[4294967296,4294967296,0],"data_offsets":[0,0])", 0).ok());
}

TEST(SafetensorsHeader, RefusesMalformedDataOffsets) {
  for (const char* offs : {"[0]", "[0,4,8]", "\"0,4\"", "[-1,3]", "[0,4.0]", "{}"})
    expect_error(parse_one(std::string(R"("dtype":"F32","shape":[1],"data_offsets":)") + offs, 4)
                     .status(),
                 StatusCode::kDataLoss, "t", "is not a pair of non-negative integers");
}

TEST(SafetensorsHeader, RefusesEndBeforeBegin) {
  expect_error(parse_one(R"("dtype":"F32","shape":[1],"data_offsets":[8,4])", 8).status(),
               StatusCode::kDataLoss, "t", "data_offsets [8, 4] end before begin");
}

TEST(SafetensorsHeader, RefusesSizeMismatch) {
  expect_error(parse_one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])", 12).status(),
               StatusCode::kDataLoss, "t", "span 8 bytes but F32 shape [3] needs 12");
  // Packed FP4 as I8: the shape counts stored bytes, so [2,3] is 6 bytes, not 12 nibbles.
  expect_error(parse_one(R"("dtype":"I8","shape":[2,3],"data_offsets":[0,3])", 12).status(),
               StatusCode::kDataLoss, "t", "needs 6");
}

TEST(SafetensorsHeader, RefusesOffsetsOutOfRange) {
  expect_error(parse_one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])", 4).status(),
               StatusCode::kDataLoss, "t",
               "data_offsets [0, 8] run past the end of the data section (4 bytes): the file is "
               "truncated");
  // Offsets that would wrap a 64-bit addition still do not reach memory.
  expect_error(parse_one(R"("dtype":"U8","shape":[4],"data_offsets":[18446744073709551612,)"
                         R"(18446744073709551616])",
                         4)
                   .status(),
               StatusCode::kDataLoss, "t", "data_offsets");
  expect_error(parse_one(R"("dtype":"U8","shape":[4],"data_offsets":[18446744073709551611,)"
                         R"(18446744073709551615])",
                         4)
                   .status(),
               StatusCode::kDataLoss, "t", "run past the end");
}

TEST(SafetensorsHeader, RefusesOverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})";
  const Status st = parse(raw_safetensors(header, std::vector<uint8_t>(12))).status();
  expect_error(st, StatusCode::kDataLoss, "b", "overlap tensor 'a' [0, 8]");
  // Identical ranges overlap too.
  const std::string same = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})";
  expect_error(parse(raw_safetensors(same, std::vector<uint8_t>(4))).status(), StatusCode::kDataLoss,
               "", "overlap");
}

TEST(SafetensorsHeader, RefusesBadMetadata) {
  expect_error(parse(raw_safetensors(R"({"__metadata__":{"k":1}})", {})).status(),
               StatusCode::kDataLoss, "", "\"__metadata__\" key 'k' is a JSON number");
  expect_error(parse(raw_safetensors(R"({"__metadata__":"x"})", {})).status(), StatusCode::kDataLoss,
               "", "\"__metadata__\" is a JSON string");
}

TEST(SafetensorsHeader, RefusesDuplicateTensorNames) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_error(parse(raw_safetensors(header, std::vector<uint8_t>(2))).status(),
               StatusCode::kDataLoss, "a", "appears twice");
}

TEST(SafetensorsHeader, RefusesNestingWhereScalarsBelongWithoutRecursing) {
  expect_error(parse_one(R"("dtype":"U8","shape":[[1]],"data_offsets":[0,1])", 1).status(),
               StatusCode::kDataLoss, "t", "shape[0] = [...] is not a non-negative integer");
  expect_error(parse_one(R"("dtype":["F32"],"shape":[1],"data_offsets":[0,4])", 4).status(),
               StatusCode::kDataLoss, "t", "\"dtype\" is not a string");
  // A million open brackets must be an error, not a stack overflow: as an entry, inside a shape,
  // and inside an unknown field (which is skipped by counting, never built).
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  expect_error(parse(raw_safetensors("{\"t\":" + deep + "}", {})).status(), StatusCode::kDataLoss,
               "t", "header entry is a JSON array");
  expect_error(parse_one(R"("dtype":"U8","data_offsets":[0,1],"shape":[1,)" + deep + "]", 1).status(),
               StatusCode::kDataLoss, "t", "shape[1] = [...]");
  EXPECT_TRUE(parse_one(R"("dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":)" + deep, 1).ok());
}

TEST(SafetensorsHeader, RefusesAbsurdRanks) {
  std::string dims = "1";
  for (int i = 0; i < 64; ++i) dims += ",1";  // 65 dimensions
  expect_error(parse_one(R"("dtype":"U8","shape":[)" + dims + R"(],"data_offsets":[0,1])", 1).status(),
               StatusCode::kDataLoss, "t", "shape has 65 dimensions, more than 64");
}

TEST(SafetensorsHeader, IgnoresUnknownEntryFields) {
  // The reference reader ignores fields it does not know; so does cedar.
  auto h = parse_one(R"("note":{"a":[1,{"b":null}]},"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1.5)", 2);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->tensors[0].shape, (std::vector<int64_t>{2}));
}

TEST(SafetensorsHeader, EscapesUnprintableNamesInMessages) {
  const Status st = parse(raw_safetensors("{\"a\\u0001b\":{\"dtype\":\"Q\",\"shape\":[],"
                                          "\"data_offsets\":[0,0]}}",
                                          {}))
                        .status();
  expect_error(st, StatusCode::kDataLoss, "a\\x01b", "unknown dtype");
}

// ---- SafetensorsFile: the same parser bound to a mapped file ----

TEST(SafetensorsFile, ViewsPointIntoTheMappingWithoutCopies) {
  testing::ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::string header = R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[5,8]},)"
                             R"("w":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}})";
  const std::vector<uint8_t> data = {1, 2, 3, 4, 0xEE, 7, 8, 9};
  testing::write_bytes(path, raw_safetensors(header, data));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->file_size(), 8 + header.size() + data.size());
  EXPECT_EQ(f->tensor_bytes(), 7u);
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorView* x = f->find("x");
  const TensorView* w = f->find("w");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(f->find("y"), nullptr);
  EXPECT_EQ(f->find(""), nullptr);
  // Both views alias the mapping at 8 + header + begin.
  EXPECT_TRUE(f->mapping().contains(x->data, x->nbytes));
  EXPECT_TRUE(f->mapping().contains(w->data, w->nbytes));
  EXPECT_EQ(x->data, f->mapping().data() + 8 + header.size() + 5);
  EXPECT_EQ(x->file_offset, 8 + header.size() + 5);
  EXPECT_EQ(w->data, f->mapping().data() + 8 + header.size());
  EXPECT_EQ(std::vector<uint8_t>(x->data, x->data + x->nbytes), (std::vector<uint8_t>{7, 8, 9}));
  EXPECT_EQ(std::vector<uint8_t>(w->data, w->data + w->nbytes), (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(w->numel(), 2);
  EXPECT_EQ(w->file, path);
  // Moving the file keeps the views (and the mapping) where they were.
  const uint8_t* before = x->data;
  SafetensorsFile moved = std::move(f).value();
  EXPECT_EQ(moved.find("x"), x);
  EXPECT_EQ(moved.find("x")->data, before);
  moved.prefetch(*x);
  moved.drop(*x);
  EXPECT_EQ(x->data[0], 7);  // still readable after the pages were dropped
}

TEST(SafetensorsFile, EveryTruncationOfAValidFileIsAnErrorNamingTheFile) {
  testing::ScratchDir dir;
  const std::string header = R"({"__metadata__":{"k":"v"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  const std::vector<uint8_t> full = raw_safetensors(header, testing::pattern(11, 1));
  const std::string path = dir.file("cut.safetensors");
  for (size_t len = 0; len < full.size(); ++len) {
    testing::write_bytes(path, std::vector<uint8_t>(full.begin(), full.begin() + len));
    const auto f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.ok()) << "cut at " << len;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().to_string();
    EXPECT_THAT(f.status().message(), HasSubstr(path));
    EXPECT_THAT(f.status().message(), HasSubstr("truncated")) << "cut at " << len << ": "
                                                              << f.status().message();
    // Once the header is whole, the message also names a tensor that no longer fits: "a" holds
    // data bytes [0, 8), "b" [8, 11).
    if (len >= 8 + header.size()) {
      const char* cut_tensor = len < 8 + header.size() + 8 ? "tensor 'a'" : "tensor 'b'";
      EXPECT_THAT(f.status().message(), HasSubstr(cut_tensor)) << f.status().message();
    }
  }
  testing::write_bytes(path, full);
  EXPECT_TRUE(SafetensorsFile::open(path).ok());
}

TEST(SafetensorsFile, OsErrorsNameThePath) {
  testing::ScratchDir dir;
  const auto missing = SafetensorsFile::open(dir.file("nope.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIo);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.file("nope.safetensors")));
  EXPECT_THAT(missing.status().message(), HasSubstr("No such file"));
  const auto is_dir = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(is_dir.ok());
  EXPECT_EQ(is_dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(is_dir.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace cedar::io
