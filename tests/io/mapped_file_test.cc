// MappedFile: maps whole files read-only, moves without copying, and reports OS errors by path.
#include "io/mapped_file.h"

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

}  // namespace
}  // namespace cedar::io
