// cedar render: the prompt a request body would run, as the server would build it (same request
// conversion and renderer), so anyone can diff cedar against DeepSeek's own protocol library.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "bundled_tokenizer.h"
#include "command.h"
#include "cedar/platform.h"
#include "cedar/prompt.h"
#include "cedar/tokenizer.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar render (--api chat|responses|messages --body FILE [--json] | --bodies FILE.jsonl)\n"
    "                    [--thinking on|off] [-m DIR | --tokenizer DIR]\n"
    "Prints the prompt a request body would run on `cedar serve`: the prompt text, its special\n"
    "ranges (the control tokens the encoder placed; everything else is encoded as plain text) and\n"
    "the token ids.\n"
    "  --api A          chat (/v1/chat/completions), responses (/v1/responses) or messages\n"
    "                   (/v1/messages)\n"
    "  --body FILE      the JSON request body ('-' reads standard input)\n"
    "  --json           one JSON object: prompt, special_ranges ([start, end) code point offsets\n"
    "                   into prompt, as deepseek-recipe's Python API reports them), token_ids, thinking\n"
    "  --bodies FILE    many requests: one {\"api\", \"body\"[, \"name\"]} object per line; prints one\n"
    "                   --json object per line (or {\"name\", \"error\"} for a refused body)\n"
    "  --thinking on|off  the mode when the request does not choose (as `cedar serve --thinking`;\n"
    "                   default on, deepseek-recipe's ConversionOptions() default)\n"
    "  -m DIR           use the checkpoint's tokenizer (default: the repository's V4.1 tokenizer,\n"
    "  --tokenizer DIR  data/tokenizers/deepseek-v4 with V4.1's markers)\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cedar render: %s\n%s", message.c_str(), kUsage);
  return 2;
}

// Code point offset of each byte offset that starts a character (and of the end).
size_t code_points_before(const std::string& text, size_t byte_offset) {
  size_t n = 0;
  for (size_t i = 0; i < byte_offset && i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++n;
  return n;
}

Result<std::string> read_body(const std::string& path) {
  if (path != "-") return read_whole_file(path);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) out.append(buf, n);
  return out;
}

struct Rendered {
  std::optional<serve::ApiError> error;  // what the server would answer instead
  serve::RenderedChat chat;
};

Rendered render_body(const std::string& api, const std::string& text, const tokenizer::Tokenizer& tok,
                     const serve::PromptSettings& settings) {
  Rendered out;
  serve::OrderedJson body;
  serve::ChatRequest request;
  out.error = serve::parse_body(text, &body);
  if (!out.error) {
    out.error = api == "chat"        ? serve::parse_chat_completion_request(body, &request)
                : api == "responses" ? serve::parse_responses_request(body, &request)
                : api == "messages"  ? serve::parse_messages_request(body, &request)
                                     : serve::invalid_request("unknown api '" + api + "'");
  }
  if (out.error) return out;
  auto rendered = serve::render_chat_prompt(request, request.messages, tok, settings);
  if (serve::ApiError* e = std::get_if<serve::ApiError>(&rendered)) {
    out.error = std::move(*e);
  } else {
    out.chat = std::move(std::get<serve::RenderedChat>(rendered));
  }
  return out;
}

std::string error_text(const serve::ApiError& e) {
  return "the server would answer " + std::to_string(e.http_status()) + ": " + e.message +
         (e.param.empty() ? "" : " (" + e.param + ")");
}

nlohmann::ordered_json to_json(const serve::RenderedChat& chat) {
  nlohmann::ordered_json out;
  out["prompt"] = chat.prompt.text;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& [b, e] : chat::special_ranges(chat.prompt))
    list.push_back({code_points_before(chat.prompt.text, b), code_points_before(chat.prompt.text, e)});
  out["special_ranges"] = std::move(list);
  out["token_ids"] = chat.ids;
  out["thinking"] = chat.thinking;
  return out;
}

void print_json(const nlohmann::ordered_json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
}

// --bodies: one {"api", "body"[, "name"]} object per line in, one result object per line out (a
// corpus is rendered with one tokenizer load).
int render_bodies(const std::string& text, const tokenizer::Tokenizer& tok, const serve::PromptSettings& settings) {
  size_t line_no = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json item = nlohmann::ordered_json::parse(line, nullptr, false);
    if (item.is_discarded() || !item.is_object() || !item.contains("api") || !item["api"].is_string() ||
        !item.contains("body")) {
      std::fprintf(stderr, "cedar render: --bodies line %zu is not {\"api\": ..., \"body\": ...}\n", line_no);
      return 1;
    }
    Rendered r = render_body(item["api"].get<std::string>(), item["body"].dump(), tok, settings);
    nlohmann::ordered_json out;
    if (item.contains("name")) out["name"] = item["name"];
    if (r.error) {
      out["error"] = error_text(*r.error);
    } else {
      out.update(to_json(r.chat));
    }
    print_json(out);
  }
  return 0;
}

int cmd_render(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--api", "--body", "--bodies", "--thinking", "--model", "--tokenizer"},
                          {"--json", "--help"}, {{"-m", "--model"}});
  if (!args.ok()) return usage_error(args.status().message());
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  const bool batch = args->has("--bodies");
  if (batch == (args->has("--api") || args->has("--body")) || (!batch && !(args->has("--api") && args->has("--body"))))
    return usage_error("give --api and --body, or --bodies");
  const std::string api = args->get_or("--api", "");
  if (!batch && api != "chat" && api != "responses" && api != "messages")
    return usage_error("--api must be chat, responses or messages, got '" + api + "'");
  const std::string thinking = args->get_or("--thinking", "on");
  if (thinking != "on" && thinking != "off") return usage_error("--thinking must be on or off");
  if (args->has("--model") && args->has("--tokenizer")) return usage_error("give -m or --tokenizer, not both");
  const std::string tokenizer_dir =
      args->has("--model") ? *args->get("--model") : args->get_or("--tokenizer", bundled_tokenizer_dir());

  auto text = read_body(*args->get(batch ? "--bodies" : "--body"));
  if (!text.ok()) {
    std::fprintf(stderr, "cedar render: %s\n", text.status().message().c_str());
    return 1;
  }
  auto tok = tokenizer::load_with_v41_markers(tokenizer_dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "cedar render: %s (pass -m DIR or --tokenizer DIR)\n", tok.status().message().c_str());
    return 1;
  }
  serve::PromptSettings settings;
  settings.default_thinking = thinking == "on";
  if (batch) return render_bodies(*text, **tok, settings);

  Rendered r = render_body(api, *text, **tok, settings);
  if (r.error) {
    std::fprintf(stderr, "cedar render: %s\n", error_text(*r.error).c_str());
    return 1;
  }
  if (args->has("--json")) {
    print_json(to_json(r.chat));
    return 0;
  }
  std::string s = r.chat.prompt.text + "\n\nspecial ranges (code points):";
  for (const auto& [b, e] : chat::special_ranges(r.chat.prompt))
    s += " [" + std::to_string(code_points_before(r.chat.prompt.text, b)) + "," +
         std::to_string(code_points_before(r.chat.prompt.text, e)) + ")";
  s += "\ntoken ids (" + std::to_string(r.chat.ids.size()) + "): [";
  for (size_t i = 0; i < r.chat.ids.size(); ++i) s += (i ? "," : "") + std::to_string(r.chat.ids[i]);
  s += "]\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  return 0;
}

}  // namespace

CEDAR_COMMAND("render", "print the prompt text, special ranges and token ids a request body would run", cmd_render);

}  // namespace cedar::cli
