// Body parsing and typed field access: hand-worked inputs and the exact 400 each one earns.
#include <gtest/gtest.h>

#include "serve/api/schema_util.h"

namespace cedar::serve {
namespace {

TEST(SchemaUtil, NestingDepthCountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth("{\"a\":[1,{\"b\":[]}]}"), 4);
  EXPECT_EQ(json_nesting_depth("{\"a\":\"[[[[\"}"), 1);          // brackets inside a string
  EXPECT_EQ(json_nesting_depth("{\"a\":\"\\\"[[\"}"), 1);        // an escaped quote does not end it
  EXPECT_EQ(json_nesting_depth("[[[]],[[[]]]]"), 4);
}

TEST(SchemaUtil, ParseBodyRejectsWhatIsNotAJsonObject) {
  OrderedJson out;
  for (const char* bad : {"", "{", "[1,2]", "\"text\"", "{\"a\":1,}", "{'a':1}", "nul"}) {
    SchemaError e = parse_body(bad, &out);
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_EQ(e->http_status(), 400) << bad;
  }
  EXPECT_FALSE(parse_body("{\"a\": [1, {\"b\": null}]}", &out).has_value());
  EXPECT_EQ(out["a"][0], 1);
}

TEST(SchemaUtil, ParseBodyRejectsInvalidUtf8AndLoneSurrogates) {
  OrderedJson out;
  EXPECT_TRUE(parse_body(std::string("{\"a\":\"\xff\"}"), &out).has_value());
  EXPECT_TRUE(parse_body("{\"a\":\"\\ud800\"}", &out).has_value());
  EXPECT_FALSE(parse_body("{\"a\":\"\\ud83e\\udd99\"}", &out).has_value());  // a valid pair
  EXPECT_EQ(out["a"].get<std::string>(), "\xF0\x9F\xA6\x99");
}

TEST(SchemaUtil, ParseBodyRejectsDeepNesting) {
  OrderedJson out;
  std::string deep = "{\"a\":" + std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']') + "}";
  SchemaError e = parse_body(deep, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("nests deeper"), std::string::npos);
  std::string ok = "{\"a\":" + std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']') + "}";
  EXPECT_FALSE(parse_body(ok, &out).has_value());
}

TEST(SchemaUtil, KeyOrderIsKept) {
  OrderedJson out;
  ASSERT_FALSE(parse_body("{\"z\":1,\"a\":2,\"m\":3}", &out).has_value());
  EXPECT_EQ(to_wire(out), "{\"z\":1,\"a\":2,\"m\":3}");
}

TEST(SchemaUtil, ReadIntAcceptsIntegralFloatsAndChecksRange) {
  const OrderedJson obj = OrderedJson::parse(R"({"a": 3, "b": 3.0, "c": 3.5, "d": "3", "e": 99})");
  std::optional<int64_t> v;
  EXPECT_FALSE(read_int(obj, "a", "", 0, 10, &v).has_value());
  EXPECT_EQ(*v, 3);
  EXPECT_FALSE(read_int(obj, "b", "", 0, 10, &v).has_value());
  EXPECT_EQ(*v, 3);
  EXPECT_TRUE(read_int(obj, "c", "", 0, 10, &v).has_value());
  EXPECT_TRUE(read_int(obj, "d", "", 0, 10, &v).has_value());
  SchemaError e = read_int(obj, "e", "outer", 0, 10, &v);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "outer.e");
  v.reset();
  EXPECT_FALSE(read_int(obj, "missing", "", 0, 10, &v).has_value());
  EXPECT_FALSE(v.has_value());
}

TEST(SchemaUtil, ReadStringNamesTheFieldPath) {
  const OrderedJson obj = OrderedJson::parse(R"({"role": 7})");
  std::string s;
  SchemaError e = read_string(obj, "role", "messages[2]", &s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[2].role");
  EXPECT_EQ(e->message, "'messages[2].role' must be a string (got a number)");
  e = read_string(obj, "name", "tools[0]", &s, /*required=*/true);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message, "'tools[0].name' is required");
}

TEST(SchemaUtil, TextContentJoinsPartsLikeTheEncoder) {
  std::string out;
  const OrderedJson parts = OrderedJson::parse(R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])");
  EXPECT_FALSE(read_text_content(parts, "c", {"text"}, &out).has_value());
  EXPECT_EQ(out, "a\n\nb");
  EXPECT_FALSE(read_text_content(OrderedJson(nullptr), "c", {"text"}, &out).has_value());
  EXPECT_EQ(out, "");
  const OrderedJson image = OrderedJson::parse(R"([{"type":"image_url","image_url":{"url":"x"}}])");
  SchemaError e = read_text_content(image, "messages[0].content", {"text"}, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[0].content[0].type");
  EXPECT_NE(e->message.find("only text parts"), std::string::npos);
}

TEST(SchemaUtil, StopStrings) {
  std::vector<std::string> stop;
  EXPECT_FALSE(read_stop(OrderedJson("END"), "stop", 4, &stop).has_value());
  EXPECT_EQ(stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(read_stop(OrderedJson::parse(R"(["a","b"])"), "stop", 4, &stop).has_value());
  EXPECT_EQ(stop.size(), 2u);
  EXPECT_TRUE(read_stop(OrderedJson::parse(R"(["a","b","c","d","e"])"), "stop", 4, &stop).has_value());
  EXPECT_TRUE(read_stop(OrderedJson::parse(R"([""])"), "stop", 4, &stop).has_value());
  EXPECT_TRUE(read_stop(OrderedJson::parse(R"([1])"), "stop", 4, &stop).has_value());
}

TEST(SchemaUtil, EffortWordsMapOntoTheDocumentedScale) {
  // The "Reasoning Effort: N" deepseek-recipe 0.2.0 renders for each word (ChatCompletionRequest
  // with reasoning_effort = word -> DeepseekV41Encoding): none = thinking off.
  const std::pair<const char*, int> table[] = {{"minimal", 50}, {"low", 50},   {"medium", 75},
                                               {"high", 75},    {"xhigh", 75}, {"max", 100}};
  for (const auto& [word, value] : table) {
    ReasoningOptions r;
    EXPECT_FALSE(read_effort(OrderedJson(word), "reasoning_effort", &r).has_value()) << word;
    EXPECT_EQ(r.effort, value) << word;
    EXPECT_EQ(r.thinking, true) << word;
  }
  ReasoningOptions r;
  EXPECT_FALSE(read_effort(OrderedJson("none"), "reasoning_effort", &r).has_value());
  EXPECT_EQ(r.thinking, false);
  EXPECT_FALSE(r.effort.has_value());
  for (int v : {1, 37, 100}) {
    ReasoningOptions n;
    EXPECT_FALSE(read_effort(OrderedJson(v), "reasoning_effort", &n).has_value());
    EXPECT_EQ(n.effort, v);
  }
  for (const OrderedJson& bad : {OrderedJson(0), OrderedJson(101), OrderedJson("extreme"), OrderedJson(2.5)}) {
    ReasoningOptions b;
    EXPECT_TRUE(read_effort(bad, "reasoning_effort", &b).has_value()) << bad.dump();
  }
}

TEST(SchemaUtil, EffortFromCommandLineText) {
  ReasoningOptions a, b, c;
  EXPECT_FALSE(read_effort_text("37", &a).has_value());
  EXPECT_EQ(a.effort, 37);
  EXPECT_FALSE(read_effort_text("high", &b).has_value());
  EXPECT_EQ(b.effort, 75);
  EXPECT_TRUE(read_effort_text("1000", &c).has_value());
  EXPECT_TRUE(read_effort_text("", &c).has_value());
}

TEST(SchemaUtil, HistoryArgumentsMayBeAnyTextButNotTooDeep) {
  // deepseek-recipe 0.2.0 converts these (non-objects become one "arguments" string parameter).
  EXPECT_FALSE(check_history_arguments("{\"a\": 1}", "x").has_value());
  EXPECT_FALSE(check_history_arguments("[1]", "x").has_value());
  EXPECT_FALSE(check_history_arguments("{\"a\": ", "x").has_value());
  EXPECT_TRUE(check_history_arguments(std::string(10000, '['), "x").has_value());
}

TEST(SchemaUtil, RandomIdsHavePrefixAndAlphabet) {
  const std::string a = random_id("call_"), b = random_id("call_");
  EXPECT_EQ(a.size(), 5u + 24u);
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_NE(a, b);
  for (char c : a.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << a;
}

}  // namespace
}  // namespace cedar::serve
