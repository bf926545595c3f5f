// cedar tokenize / detokenize / encode-chat: the tokenizer and the DeepSeek prompt encoder from
// the command line.
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "cedar/prompt.h"
#include "command.h"
#include "cedar/tokenizer.h"

namespace cedar::cli {
namespace {

using tokenizer::TokenId;
using tokenizer::Tokenizer;

Result<std::string> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --tokenizer names a tokenizer.json (its sibling tokenizer_config.json is used when present) or
// a directory holding both.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (!std::filesystem::exists(path + "/tokenizer.json", ec)) {
      return not_found("no tokenizer.json in directory " + path);
    }
    return Tokenizer::load_dir(path);
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string config = dir + "/tokenizer_config.json";
  std::ifstream probe_cfg(config);
  return Tokenizer::load(path, probe_cfg ? config : "");
}

void print_ids(const std::vector<TokenId>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// Exit code 2 for a bad flag value, 1 for everything else (a missing file, bad file content).
int fail(const Status& s, bool from_flag = false) {
  std::fprintf(stderr, "cedar: %s\n", s.to_string().c_str());
  return from_flag ? 2 : 1;
}

int cmd_tokenize(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--tokenizer", "--text", "--file"}, {"--add-special", "--help"}, {{"-t", "--tokenizer"}});
  if (!args.ok()) return fail(args.status(), true);
  if (args->has("--help")) {
    std::printf(
        "usage: cedar tokenize --tokenizer FILE|DIR (--text TEXT | --file PATH) [--add-special]\n"
        "Prints the token ids of the text as a JSON array. --add-special adds BOS/EOS as\n"
        "tokenizer_config.json says.\n");
    return 0;
  }
  if (!args->has("--tokenizer") || args->has("--text") == args->has("--file")) {
    std::fprintf(stderr, "cedar tokenize: needs --tokenizer and exactly one of --text or --file\n");
    return 2;
  }
  std::string text;
  if (args->has("--text")) {
    text = *args->get("--text");
  } else {
    auto t = read_all(*args->get("--file"));
    if (!t.ok()) return fail(t.status());
    text = std::move(*t);
  }
  auto tok = load_tokenizer(*args->get("--tokenizer"));
  if (!tok.ok()) return fail(tok.status());
  auto ids = (*tok)->encode(text, args->has("--add-special"));
  if (!ids.ok()) return fail(ids.status(), args->has("--text"));
  print_ids(*ids);
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--tokenizer", "--ids"}, {"--skip-special", "--help"}, {{"-t", "--tokenizer"}});
  if (!args.ok()) return fail(args.status(), true);
  if (args->has("--help")) {
    std::printf(
        "usage: cedar detokenize --tokenizer FILE|DIR --ids 1,2,3 [--skip-special]\n"
        "Prints the text of the ids (a comma list or a JSON array).\n");
    return 0;
  }
  if (!args->has("--tokenizer") || !args->has("--ids")) {
    std::fprintf(stderr, "cedar detokenize: needs --tokenizer and --ids\n");
    return 2;
  }
  std::vector<TokenId> ids;
  std::string list = *args->get("--ids");
  for (char& c : list) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(list);
  std::string item;
  while (in >> item) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end || v < 0 || v > INT32_MAX) {
      std::fprintf(stderr, "cedar detokenize: --ids: '%s' is not a token id\n", item.c_str());
      return 2;
    }
    ids.push_back(static_cast<TokenId>(v));
  }
  auto tok = load_tokenizer(*args->get("--tokenizer"));
  if (!tok.ok()) return fail(tok.status());
  auto text = (*tok)->decode(ids, args->has("--skip-special"));
  if (!text.ok()) return fail(text.status(), true);
  std::fwrite(text->data(), 1, text->size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int cmd_encode_chat(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--tokenizer", "--messages", "--effort", "--format"},
                          {"--thinking", "--ids", "--keep-thinking", "--help"}, {{"-t", "--tokenizer"}});
  if (!args.ok()) return fail(args.status(), true);
  if (args->has("--help")) {
    std::printf(
        "usage: cedar encode-chat --messages FILE.json [--tokenizer FILE|DIR] [--thinking] [--effort E]\n"
        "                         [--keep-thinking] [--format v41|v4] [--ids]\n"
        "Prints the DeepSeek prompt of OpenAI-style messages (a JSON array, or an object with\n"
        "\"messages\" and \"tools\"). --thinking selects thinking mode; --effort is 1..100 or\n"
        "low|high|xhigh|max (V4.1) / high|max (V4); --keep-thinking turns drop_thinking off;\n"
        "--ids prints token ids instead (needs --tokenizer).\n");
    return 0;
  }
  if (!args->has("--messages") || (args->has("--ids") && !args->has("--tokenizer"))) {
    std::fprintf(stderr, "cedar encode-chat: needs --messages (and --tokenizer with --ids)\n");
    return 2;
  }
  chat::ChatOptions options;
  const std::string format = args->get_or("--format", "v41");
  if (format == "v41") {
    options.format = chat::PromptFormat::kV41;
  } else if (format == "v4") {
    options.format = chat::PromptFormat::kV4;
  } else {
    std::fprintf(stderr, "cedar encode-chat: --format must be v41 or v4\n");
    return 2;
  }
  options.thinking_mode = args->has("--thinking") ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  options.drop_thinking = !args->has("--keep-thinking");
  if (args->has("--effort")) {
    options.reasoning_effort = chat::reasoning_effort_from_flag(*args->get("--effort"));
    if (Status s = chat::validate_reasoning_effort(options.reasoning_effort, options.format); !s.ok()) {
      return fail(s, true);
    }
  }
  auto json = read_all(*args->get("--messages"));
  if (!json.ok()) return fail(json.status());
  auto prompt = chat::encode_chat_json(*json, options);
  if (!prompt.ok()) return fail(prompt.status());
  if (!args->has("--ids")) {
    std::fwrite(prompt->text.data(), 1, prompt->text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  auto tok = load_tokenizer(*args->get("--tokenizer"));
  if (!tok.ok()) return fail(tok.status());
  auto ids = chat::encode_chat_ids(**tok, *prompt, options.format);
  if (!ids.ok()) return fail(ids.status());
  print_ids(*ids);
  return 0;
}

}  // namespace

CEDAR_COMMAND("tokenize", "print the token ids of a text (JSON array)", cmd_tokenize);
CEDAR_COMMAND("detokenize", "print the text of token ids", cmd_detokenize);
CEDAR_COMMAND("encode-chat", "render OpenAI-style messages as a DeepSeek V4.1/V4 prompt", cmd_encode_chat);

}  // namespace cedar::cli
