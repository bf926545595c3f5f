#include "core/status.h"

#include <gtest/gtest.h>

namespace cedar {
namespace {

Result<int> half(int x) {
  if (x % 2) return invalid_argument("odd: " + std::to_string(x));
  return x / 2;
}

Status quarter(int x, int* out) {
  CEDAR_ASSIGN_OR_RETURN(int h, half(x));
  CEDAR_ASSIGN_OR_RETURN(*out, half(h));
  return {};
}

TEST(Status, ResultCarriesValueOrError) {
  EXPECT_TRUE(half(4).ok());
  EXPECT_EQ(half(4).value(), 2);
  auto r = half(3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().to_string(), "InvalidArgument: odd: 3");
}

TEST(Status, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = quarter(6, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(Status, IoErrorAppendsErrno) {
  Status s = io_error("open x", 2);
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_NE(s.message().find("No such file"), std::string::npos);
}

}  // namespace
}  // namespace cedar
