// Server-sent events framing, checked against hand-written event-stream text (WHATWG format).
#include <gtest/gtest.h>

#include "serve/http/sse.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

TEST(Sse, DataEvent) { EXPECT_EQ(sse_data("{\"a\":1}"), "data: {\"a\":1}\n\n"); }

TEST(Sse, NamedEvent) {
  EXPECT_EQ(sse_event("message_start", "{}"), "event: message_start\ndata: {}\n\n");
}

TEST(Sse, CommentIsIgnoredByReaders) {
  EXPECT_EQ(sse_comment("keep-alive"), ": keep-alive\n\n");
  EXPECT_TRUE(test::parse_sse(sse_comment("keep-alive")).empty());
}

TEST(Sse, LineBreaksInPayloadBecomeSeparateDataLines) {
  // A raw newline must not end the event or forge a field: each line gets its own "data:".
  EXPECT_EQ(sse_data("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(sse_data("a\r\nb\rc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(sse_event("x", "1\n\nevent: forged"), "event: x\ndata: 1\ndata: \ndata: event: forged\n\n");
  const auto events = test::parse_sse(sse_event("x", "1\n\nevent: forged"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event, "x");
  EXPECT_EQ(events[0].data, "1\n\nevent: forged");  // readers join data lines with \n
}

TEST(Sse, EmptyPayload) { EXPECT_EQ(sse_data(""), "data: \n\n"); }

}  // namespace
}  // namespace cedar::serve
