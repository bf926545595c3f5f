// Images through the three APIs (OpenAI Chat image_url, Responses input_image, Anthropic image
// blocks) on a scripted engine that reports a vision tower: each image becomes its span in the
// prompt (the prompt grows by the span's length), and hostile or refused images get a 400 naming the
// image and the fix: a decompression bomb, a truncated file, bytes of no image format, an image over
// the byte limit, too many images, too many image tokens, a remote URL, a model without a tower.
#include <array>

#include "runtime/scripted_engine.h"
#include "serve/api/image_inputs.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;

std::string file_bytes(const std::string& path) { return test::read_file(path); }

std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A 13x9 RGB PNG of the decoder's corpus.
std::string small_png() { return file_bytes(CEDAR_SOURCE_DIR "/tests/image/fuzz/corpus/rgb.png"); }

// The same PNG whose header claims 60000 x 60000 pixels (CRC fixed, so only the size is wrong).
std::string bomb_png() {
  std::string p = small_png();
  for (int at : {16, 20}) {
    const uint32_t v = 60000;
    p[at] = char(v >> 24), p[at + 1] = char(v >> 16), p[at + 2] = char(v >> 8), p[at + 3] = char(v);
  }
  const uint32_t crc = crc32(p.substr(12, 17));  // "IHDR" + 13 bytes of data
  for (int k = 0; k < 4; ++k) p[29 + k] = char(crc >> (24 - 8 * k));
  return p;
}

std::string data_url(const std::string& bytes) { return "data:image/png;base64," + base64(bytes); }

json openai_body(const std::vector<std::string>& images) {
  json content = json::array({{{"type", "text"}, {"text", "What is in this picture?"}}});
  for (const std::string& im : images) content.push_back({{"type", "image_url"}, {"image_url", {{"url", im}}}});
  return {{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 4}};
}

runtime::EngineInfo vision_info() {
  runtime::EngineInfo info = test::test_engine_info();
  // The test tokenizer's <｜deepseek_image｜> (the released tokenizer's is 129264, config.json's id).
  info.image_token_id = *test::test_tokenizer().token_to_id("<｜deepseek_image｜>");
  info.vision.present = true;
  info.vision.patch_size = 14;
  info.vision.downsample = 3;
  info.vision.max_n_token = 1024;
  info.vision.min_pixels = 295936;
  return info;
}

class ImageRequestTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}, bool vision = true) {
    std::vector<runtime::ScriptedReply> replies = {{"", test::ids_of("A picture." + std::string(test::kEos))}};
    engine_ = std::make_unique<runtime::ScriptedEngine>(
        std::move(replies), vision ? vision_info() : test::test_engine_info(), runtime::ScriptedEngineOptions{},
        [](std::span<const int32_t> ids) {
          auto t = test::test_tokenizer().decode(ids, false);
          return t.ok() ? *t : std::string();
        });
    server_ = std::make_unique<test::TestServer>(*engine_, options);
    client_ = server_->client();
  }
  json post(const std::string& path, const json& body, int* status) {
    return test::post_json(*client_, path, body, status);
  }
  // A 400 whose message holds every one of `words`.
  void expect_400(const json& body, std::initializer_list<const char*> words, const std::string& path = "/v1/chat/completions") {
    int status = 0;
    const json r = post(path, body, &status);
    EXPECT_EQ(status, 400) << r.dump();
    const std::string msg = r.contains("error") ? r["error"].value("message", "") : "";
    for (const char* w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  }
  std::unique_ptr<runtime::ScriptedEngine> engine_;
  std::unique_ptr<test::TestServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

// 13x9 pixels: under min_pixels, so planned at 653x452 -> 658x462 -> a 33x47 patch grid -> 11 rows of
// 16 tokens: 11 * 17 + 2 = 189 span positions in place of the one placeholder.
constexpr int kSpan = 11 * 17 + 2;

TEST_F(ImageRequestTest, EachApiTakesAnInlineImageAsItsSpan) {
  start();
  int status = 0;
  json text_only = openai_body({});
  const json r0 = post("/v1/chat/completions", text_only, &status);
  ASSERT_EQ(status, 200) << r0.dump();
  const json r1 = post("/v1/chat/completions", openai_body({data_url(small_png())}), &status);
  ASSERT_EQ(status, 200) << r1.dump();
  const int grown = r1["usage"]["prompt_tokens"].get<int>() - r0["usage"]["prompt_tokens"].get<int>();
  // The span, minus its placeholder, plus the "\n\n" joining the text and image blocks (1 or 2 ids).
  EXPECT_GE(grown, kSpan - 1) << grown;
  EXPECT_LE(grown, kSpan + 2) << grown;

  const json anthropic = {{"max_tokens", 4},
                          {"messages",
                           {{{"role", "user"},
                             {"content",
                              {{{"type", "image"},
                                {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", base64(small_png())}}}},
                               {{"type", "text"}, {"text", "What is this?"}}}}}}}};
  const json ra = post("/v1/messages", anthropic, &status);
  EXPECT_EQ(status, 200) << ra.dump();
  EXPECT_GT(ra["usage"]["input_tokens"].get<int>(), kSpan);

  const json responses = {{"max_output_tokens", 4},
                          {"input",
                           {{{"role", "user"},
                             {"content",
                              {{{"type", "input_text"}, {"text", "What is this?"}},
                               {{"type", "input_image"}, {"image_url", data_url(small_png())}}}}}}}};
  const json rr = post("/v1/responses", responses, &status);
  EXPECT_EQ(status, 200) << rr.dump();
  EXPECT_GT(rr["usage"]["input_tokens"].get<int>(), kSpan);
}

TEST_F(ImageRequestTest, HostileImagesGetA400NamingTheImage) {
  ServerOptions options;
  options.service.images.decode.max_bytes = 64 << 10;
  start(options);
  expect_400(openai_body({data_url(bomb_png())}), {"image 1", "60000x60000", "decompression bomb"});
  const std::string png = small_png();
  expect_400(openai_body({data_url(png.substr(0, png.size() / 2))}), {"image 1", "truncated or corrupt"});
  expect_400(openai_body({data_url(small_png()), data_url("this is not an image at all")}), {"image 2"});
  std::string big = png;
  big.resize(100 << 10, '\0');
  expect_400(openai_body({data_url(big)}), {"image 1", "exceed the limit"});
  expect_400(openai_body({"data:image/png;base64,@@@@"}), {"image 1", "base64"});
}

TEST_F(ImageRequestTest, CountAndTokenLimitsAndRemoteUrlsAreRefused) {
  ServerOptions options;
  options.service.images.max_images = 2;
  options.service.images.max_image_tokens = 300;
  start(options);
  const std::string im = data_url(small_png());
  expect_400(openai_body({im, im, im}), {"3 images", "limit of 2"});
  expect_400(openai_body({im, im}), {"image 2", "limit of 300 image tokens"});
  expect_400(openai_body({"https://example.com/cat.png"}), {"does not fetch", "base64"});
  const json anthropic_url = {
      {"max_tokens", 4},
      {"messages",
       {{{"role", "user"},
         {"content", {{{"type", "image"}, {"source", {{"type", "url"}, {"url", "https://example.com/a.png"}}}}}}}}}};
  expect_400(anthropic_url, {"does not fetch"}, "/v1/messages");
}

TEST_F(ImageRequestTest, AModelWithoutAVisionTowerRefusesImages) {
  start({}, /*vision=*/false);
  expect_400(openai_body({data_url(small_png())}), {"no vision tower"});
}

}  // namespace
}  // namespace cedar::serve
