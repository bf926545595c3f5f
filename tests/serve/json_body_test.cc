// The bounded request-body parser (serve/json_body.h): the same DOM as nlohmann's own parser, Python's
// duplicate-key rule, each limit refused with a message naming it, and the cancellation check.
#include <gtest/gtest.h>

#include <string>

#include "serve/api/json_body.h"
#include "serve/api/schema_util.h"

namespace cedar::serve {
namespace {

std::optional<JsonError> parse(std::string_view text, OrderedJson* out, const JsonLimits& limits = {}) {
  return parse_json_bounded(text, limits, out);
}

std::string object_of(size_t keys, const char* prefix = "k") {
  std::string text = "{";
  for (size_t i = 0; i < keys; ++i) text += (i ? ",\"" : "\"") + std::string(prefix) + std::to_string(i) + "\":" + std::to_string(i);
  return text + "}";
}

TEST(JsonBody, BuildsTheSameDomAsNlohmannsParser) {
  const char* texts[] = {
      R"({"model":"m","messages":[{"role":"user","content":"hi \u00e9 \ud83d\ude00"}],"stream":true,"n":null})",
      R"({"a":[1,-2,3.5e10,18446744073709551615,-9223372036854775808,0.1],"b":{"c":{"d":[[],{},[{}]]}},"e":""})",
      R"({"z":1,"y":2,"x":{"w":false,"v":true}})",
      R"({"long":"0123456789012345678901234567890123456789","esc":"\"\\\/\b\f\n\r\t"})",
  };
  for (const char* text : texts) {
    OrderedJson ours;
    ASSERT_FALSE(parse(text, &ours)) << text;
    const OrderedJson reference = OrderedJson::parse(text);
    EXPECT_EQ(ours, reference) << text;
    EXPECT_EQ(ours.dump(), reference.dump()) << "key order must be the text's order: " << text;
  }
  // A large object too (past the size where members get an index), and a top-level array.
  const std::string big = object_of(5000);
  OrderedJson ours;
  ASSERT_FALSE(parse(big, &ours));
  EXPECT_EQ(ours.dump(), big);
  // Large containers are allocated at the size a first pass over brackets and commas finds; strings
  // with brackets, commas and escaped quotes must not confuse it.
  std::string tricky = "[";
  for (int i = 0; i < 40; ++i) {
    tricky += i ? "," : "";
    tricky += "{\"k\":[";
    for (int j = 0; j < 40; ++j) tricky += std::string(j ? "," : "") + "\"a,]}\\\"[{" + std::to_string(j) + "\"";
    tricky += "],\"x,\":{}}";
  }
  tricky += "]";
  ASSERT_FALSE(parse(tricky, &ours));
  EXPECT_EQ(ours, OrderedJson::parse(tricky));
  EXPECT_EQ(ours[39]["k"][39], "a,]}\"[{39");
  ASSERT_FALSE(parse("[1,[2,[3]],{\"a\":[]}]", &ours));
  EXPECT_EQ(ours.dump(), "[1,[2,[3]],{\"a\":[]}]");
}

TEST(JsonBody, ARepeatedKeyKeepsItsFirstPositionAndTakesTheLastValueAsPythonDoes) {
  OrderedJson small;
  ASSERT_FALSE(parse(R"({"a":1,"b":2,"a":{"x":[3]}})", &small));
  EXPECT_EQ(small.dump(), R"({"a":{"x":[3]},"b":2})");  // json.loads keeps the same: {'a': {'x': [3]}, 'b': 2}
  // In an object large enough to be indexed, repeats of early and late keys.
  std::string text = object_of(100);
  text.pop_back();
  text += R"(,"k0":"first again","k99":"last again","k0":"third"})";
  OrderedJson big;
  ASSERT_FALSE(parse(text, &big));
  ASSERT_EQ(big.size(), 100u);
  EXPECT_EQ(big.begin().key(), "k0");
  EXPECT_EQ(big["k0"], "third");
  EXPECT_EQ(big["k99"], "last again");
  EXPECT_EQ(big["k50"], 50);
  // Repeats do not count as new keys against the per-object limit.
  JsonLimits three;
  three.max_object_keys = 3;
  OrderedJson repeated;
  EXPECT_FALSE(parse(R"({"a":1,"b":2,"c":3,"a":4,"b":5,"c":6})", &repeated, three));
  std::string same_key = "{";
  for (int i = 0; i < 20000; ++i) same_key += i ? ",\"a\":" + std::to_string(i) : "\"a\":0";
  ASSERT_FALSE(parse(same_key + "}", &repeated)) << "20,000 members but one key";
  EXPECT_EQ(repeated.dump(), "{\"a\":19999}");
}

TEST(JsonBody, EachLimitIsRefusedWithAMessageNamingIt) {
  OrderedJson out;
  std::string deep(65, '[');
  deep += std::string(65, ']');
  std::optional<JsonError> e = parse(deep, &out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, JsonError::Kind::kLimit);
  EXPECT_NE(e->message.find("nests deeper than 64 levels"), std::string::npos) << e->message;
  EXPECT_FALSE(parse(std::string(64, '[') + std::string(64, ']'), &out)) << "64 levels are allowed";

  e = parse(object_of(10001), &out);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("more than 10,000 keys"), std::string::npos) << e->message;
  EXPECT_FALSE(parse(object_of(10000), &out));

  JsonLimits limits;
  limits.max_values = 100;
  std::string array = "[";
  for (int i = 0; i < 100; ++i) array += i ? ",1" : "1";
  e = parse(array + "]", &out, limits);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("more than 100 JSON values"), std::string::npos) << e->message;
  EXPECT_FALSE(parse(array.substr(0, array.size() - 2) + "]", &out, limits)) << "99 elements + the array";

  limits = {};
  limits.max_string_bytes = 10;
  e = parse(R"({"a":"01234567890"})", &out, limits);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("a string of 11 bytes; the limit is 10 bytes"), std::string::npos) << e->message;
  e = parse(R"({"01234567890":1})", &out, limits);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("a key of 11 bytes"), std::string::npos) << e->message;
  EXPECT_FALSE(parse(R"({"0123456789":"0123456789"})", &out, limits));
}

TEST(JsonBody, MemoryAmplificationIsBoundedByTheBodysSize) {
  // `[{},{},...]`: three bytes of text, ~60 bytes of DOM each.
  std::string text = "[";
  for (int i = 0; i < 200000; ++i) text += i ? ",{}" : "{}";
  text += "]";
  JsonLimits limits;
  limits.memory_slack = 0;
  OrderedJson out;
  JsonParseStats stats;
  std::optional<JsonError> e = parse_json_bounded(text, limits, &out, "the request body", {}, &stats);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, JsonError::Kind::kLimit);
  EXPECT_NE(e->message.find("would take more than"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("4 x its size"), std::string::npos) << e->message;
  // It stopped at the first charge past the bound; one charge is at most a container doubling (no more
  // than what was counted before it).
  EXPECT_LE(stats.estimated_bytes, 2 * 4 * text.size()) << "it stopped near the bound";
  // The same values with more text per value fit: long strings cost about their length.
  limits.memory_factor = 40;
  EXPECT_FALSE(parse_json_bounded(text, limits, &out)) << "a raised factor admits it";
  EXPECT_EQ(out.size(), 200000u);
  text = "[\"" + std::string(1u << 20, 'x') + "\"]";
  EXPECT_FALSE(parse_json_bounded(text, JsonLimits{.memory_slack = 0}, &out));
}

TEST(JsonBody, TheCancellationCheckStopsTheParse) {
  std::string text = "[";
  for (int i = 0; i < 50000; ++i) text += i ? ",1" : "1";
  text += "]";
  int calls = 0;
  OrderedJson out;
  std::optional<JsonError> e =
      parse_json_bounded(text, JsonLimits{}, &out, "the request body", [&] { return ++calls == 3; });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, JsonError::Kind::kCancelled);
  EXPECT_EQ(calls, 3) << "polled every " << kCancelCheckEvents << " values, stopped at the first true";
  calls = 0;
  EXPECT_FALSE(parse_json_bounded(text, JsonLimits{}, &out, "the request body", [&] { return ++calls < 0; }));
  EXPECT_EQ(calls, 50001 / static_cast<int>(kCancelCheckEvents));
}

TEST(JsonBody, SyntaxErrorsAndInvalidUtf8AreSyntaxErrors) {
  OrderedJson out;
  for (const char* text : {"{", "{\"a\":}", "{\"a\":1}x", "{\"a\":\"\xff\"}", "[1,]", "nul", "{\"a\" 1}"}) {
    std::optional<JsonError> e = parse(text, &out);
    ASSERT_TRUE(e) << text;
    EXPECT_EQ(e->kind, JsonError::Kind::kSyntax) << text;
    EXPECT_NE(e->message.find("is not valid JSON"), std::string::npos) << e->message;
  }
}

TEST(JsonBody, ParseBodyAppliesTheLimitsAsA400AndHistoryArgumentsToo) {
  OrderedJson body;
  SchemaError e = parse_body(object_of(10001), &body);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status(), 400);
  EXPECT_NE(e->message.find("the request body has an object with more than 10,000 keys"), std::string::npos)
      << e->message;
  EXPECT_FALSE(parse_body(R"({"messages":[]})", &body));
  e = check_history_arguments(object_of(10001), "messages[1].tool_calls[0].function.arguments");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[1].tool_calls[0].function.arguments");
  EXPECT_FALSE(check_history_arguments("not json at all {", "p")) << "text that is not JSON is accepted as before";
}

}  // namespace
}  // namespace cedar::serve
