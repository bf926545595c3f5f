// MappedFile: maps whole files read-only, moves without copying, and reports OS errors by path.
#include "io/mapped_file.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io_test_util.h"

namespace cedar::io {
namespace {

using ::testing::HasSubstr;

TEST(MappedFile, MapsTheWholeFile) {
  testing::ScratchDir dir;
  const auto bytes = testing::pattern(10000, 3);
  testing::write_bytes(dir.file("f"), bytes);
  auto m = MappedFile::open(dir.file("f"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->size(), bytes.size());
  EXPECT_EQ(m->path(), dir.file("f"));
  EXPECT_EQ(std::vector<uint8_t>(m->data(), m->data() + m->size()), bytes);
  EXPECT_TRUE(m->contains(m->data(), m->size()));
  EXPECT_TRUE(m->contains(m->data() + 9999, 1));
  EXPECT_TRUE(m->contains(m->data() + 10000, 0));
  EXPECT_FALSE(m->contains(m->data() + 9999, 2));
  EXPECT_FALSE(m->contains(m->data() - 1, 1));
  EXPECT_FALSE(m->contains(bytes.data(), 1));
  // Hints, in and out of range, leave the data readable.
  m->prefetch(0, m->size());
  m->prefetch(5000, 1u << 30);
  m->prefetch(20000, 10);
  m->drop(100, 6000);
  m->drop(0, 0);
  EXPECT_EQ(m->data()[5000], bytes[5000]);
}

TEST(MappedFile, MovesKeepTheMapping) {
  testing::ScratchDir dir;
  testing::write_bytes(dir.file("f"), testing::pattern(64, 9));
  auto m = MappedFile::open(dir.file("f"));
  ASSERT_TRUE(m.ok());
  const uint8_t* p = m->data();
  MappedFile a = std::move(m).value();
  EXPECT_EQ(a.data(), p);
  MappedFile b;
  b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 64u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data()[1], 10);
}

TEST(MappedFile, EmptyFileMapsToNothing) {
  testing::ScratchDir dir;
  testing::write_bytes(dir.file("empty"), {});
  auto m = MappedFile::open(dir.file("empty"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->size(), 0u);
  EXPECT_EQ(m->data(), nullptr);
  EXPECT_TRUE(m->bytes().empty());
  m->prefetch(0, 100);
}

TEST(MappedFile, ErrorsNameThePath) {
  testing::ScratchDir dir;
  auto missing = MappedFile::open(dir.file("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIo);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.file("missing")));
  EXPECT_THAT(missing.status().message(), HasSubstr("No such file or directory"));
}

// The lines of /proc/self/maps: one per mapped region of this process.
size_t mapped_regions() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return n;
}

// Mappings of 2 MiB and more sit at an address congruent to their file offset modulo 2 MiB (so the
// kernel can map a 2 MiB page-cache folio with one entry), hold the file's bytes, and leave nothing
// of the larger reservation they were placed in behind when they close.
TEST(MappedFile, LargeMappingsAreAlignedForHugePages) {
  testing::ScratchDir dir;
  const size_t size = 3 * kHugePageAlignment + 12345;
  const auto bytes = testing::pattern(size, 7);
  testing::write_bytes(dir.file("big"), bytes);
  const size_t regions_before = mapped_regions();
  {
    auto whole = MappedFile::open(dir.file("big"));
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(whole->data()) % kHugePageAlignment, 0u);
    EXPECT_EQ(std::vector<uint8_t>(whole->data(), whole->data() + size), bytes);
    // A range starting 5 pages and 3 bytes into the file: mapped from its page, at the same phase.
    const uint64_t offset = 5 * 4096 + 3, length = 2 * kHugePageAlignment + 100;
    auto range = MappedFile::open_range(dir.file("big"), offset, length);
    ASSERT_TRUE(range.ok()) << range.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(range->data()) % kHugePageAlignment, range->offset() % kHugePageAlignment);
    EXPECT_NE(range->offset() % kHugePageAlignment, 0u);
    const uint8_t* first = range->data() + (offset - range->offset());
    EXPECT_EQ(std::vector<uint8_t>(first, first + length),
              std::vector<uint8_t>(bytes.begin() + offset, bytes.begin() + offset + length));
    // Each mapping is one region (the reservation's head and tail were given back)...
    EXPECT_LE(mapped_regions(), regions_before + 2);
  }
  // ...and closing them leaves the process's mappings as they were.
  EXPECT_EQ(mapped_regions(), regions_before);
}

}  // namespace
}  // namespace cedar::io
