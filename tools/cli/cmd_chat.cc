// cedar chat: an interactive terminal chat over the same engine and chat service as `cedar serve`
// (history, thinking on/off, reasoning effort, streaming). Reads lines from stdin, so it also works
// with piped input.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>

#include "args.h"
#include "kv_tier_flags.h"
#include "residency_flags.h"
#include "command.h"
#include "cedar/platform.h"
#include "cedar/server.h"
#include "cedar/prompt.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar chat (-m DIR | --scripted FILE --tokenizer DIR) [options]\n"
    "  -m, --model DIR      checkpoint directory\n"
    "  --scripted FILE      play a script file instead of a model (see docs/SERVER.md)\n"
    "  --tokenizer DIR      tokenizer.json directory (default: the model directory)\n"
    "  --system TEXT        system prompt\n"
    "  --thinking on|off    thinking mode (default on, as DeepSeek's API; off is faster on a CPU)\n"
    "  --effort E           reasoning effort: minimal|low|medium|high|xhigh|max or 1..100\n"
    "  --max-tokens N       output budget per turn (default 4096)\n"
    "  --temperature T      sampling temperature (default 1.0; 0 = greedy)\n"
    "  --max-context N      context tokens (default: the engine's)\n"
    "  --numerics MODE      fast (default) or exact (the bit-exact numerics contract)\n"
    "  --speculative MODE   off (default), on or auto: draft with the checkpoint's DSpark head\n"
    "  --memory-budget SIZE RAM for weights, e.g. 64G (default: what the machine can spare beside the\n"
    "                       KV budget); what does not fit streams from the SSD (docs/STREAMING.md)\n"
    "  --residency-stats PATH  routing statistics for warm restarts (default DIR/.cedar-expert-stats;\n"
    "                       ~/.cache/cedar/ when DIR is read-only; 'none' keeps none)\n"
    "\n"
    "In the chat: /think on|off, /effort E, /system TEXT, /reset, /help, /quit. Ctrl-C stops the\n"
    "answer being written; Ctrl-D (end of input) leaves.\n";

constexpr const char* kHelp =
    "  /think on|off   thinking mode      /effort E   reasoning effort (word or 1..100)\n"
    "  /system TEXT    system prompt      /reset      forget the conversation\n"
    "  /quit           leave\n";

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted.store(true); }

// Prints the answer as it streams: reasoning dimmed (on a terminal), tool calls on their own line.
class TerminalSink : public serve::StreamSink {
 public:
  explicit TerminalSink(bool color) : color_(color) {}
  void on_start(const serve::Completion&) override {}
  void on_reasoning(std::string_view delta) override {
    if (!in_reasoning_ && color_) out_ += "\x1b[2m";
    in_reasoning_ = true;
    out_ += delta;
  }
  void on_content(std::string_view delta, std::span<const serve::TokenLogprob>) override {
    end_reasoning();
    out_ += delta;
  }
  void on_tool_call(size_t, const serve::ToolCall& call) override {
    end_reasoning();
    out_ += "\n[tool call] " + call.name + " " + call.arguments + "\n";
  }
  void on_finish(const serve::Completion&) override { end_reasoning(); }
  void on_error(const serve::ApiError& error) override {
    end_reasoning();
    out_ += "\n[error] " + error.message + "\n";
  }

 private:
  void end_reasoning() {
    if (!in_reasoning_) return;
    in_reasoning_ = false;
    out_ += color_ ? "\x1b[0m\n\n" : "\n\n";
  }
  bool color_;
  bool in_reasoning_ = false;
};

struct ChatState {
  serve::ChatRequest request;  // history + settings, reused for every turn
};

// Handles a /command; false when the chat should end.
bool run_command(const std::string& line, ChatState* state) {
  const size_t space = line.find(' ');
  const std::string cmd = line.substr(0, space);
  const std::string arg = space == std::string::npos ? "" : line.substr(space + 1);
  auto& r = state->request;
  if (cmd == "/quit" || cmd == "/exit") return false;
  if (cmd == "/reset") {
    std::erase_if(r.messages, [](const serve::Message& m) { return m.role != serve::Role::kSystem; });
    std::printf("(conversation cleared)\n");
  } else if (cmd == "/think" && (arg == "on" || arg == "off")) {
    r.reasoning.thinking = arg == "on";
    std::printf("(thinking %s)\n", arg.c_str());
  } else if (cmd == "/effort" && !arg.empty()) {
    serve::ReasoningOptions parsed;
    if (const serve::SchemaError e = serve::read_effort_text(arg, &parsed)) {
      std::printf("(%s)\n", e->message.c_str());
    } else {
      r.reasoning = parsed;
      std::printf("(effort %s, thinking %s)\n", parsed.effort ? std::to_string(*parsed.effort).c_str() : "default",
                  parsed.thinking.value_or(false) ? "on" : "off");
    }
  } else if (cmd == "/system") {
    std::erase_if(r.messages, [](const serve::Message& m) { return m.role == serve::Role::kSystem; });
    if (!arg.empty()) r.messages.insert(r.messages.begin(), serve::Message{serve::Role::kSystem, arg, "", {}, ""});
    std::printf("(system prompt %s)\n", arg.empty() ? "removed" : "set");
  } else {
    std::printf("%s", kHelp);
  }
  return true;
}

int cmd_chat(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv,
                          {"--model", "--scripted", "--tokenizer", "--system", "--thinking", "--effort",
                           "--max-tokens", "--temperature", "--max-context", "--numerics", "--speculative",
                           "--memory-budget", "--residency-stats", kKvTierFlags[0], kKvTierFlags[1], kKvTierFlags[2]},
                          {"--help"}, {{"-m", "--model"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar chat: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s%s", kUsage, kKvTierUsage);
    return 0;
  }
  serve::EngineSetup setup;
  setup.model_dir = args->get_or("--model", "");
  setup.script_path = args->get_or("--scripted", "");
  setup.tokenizer_dir = args->get_or("--tokenizer", "");
  setup.max_batch = 1;
  auto max_context = args->get_int("--max-context", 0);
  auto max_tokens = args->get_int("--max-tokens", 4096);
  auto temperature = args->get_double("--temperature", 1.0);
  const std::string thinking = args->get_or("--thinking", "on");
  for (const Status& st : {max_context.status(), max_tokens.status(), temperature.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "cedar chat: %s\n%s", st.message().c_str(), kUsage);
      return 2;
    }
  }
  std::string problem;
  if (setup.model_dir.empty() && setup.script_path.empty()) {
    problem = "no model given: pass -m DIR (a checkpoint directory) or --scripted FILE --tokenizer DIR";
  } else if (!setup.model_dir.empty() && !setup.script_path.empty()) {
    problem = "give either -m DIR or --scripted FILE, not both";
  } else if (thinking != "on" && thinking != "off") {
    problem = "--thinking must be on or off, got '" + thinking + "'";
  } else if (*max_tokens < 1) {
    problem = "--max-tokens must be at least 1";
  } else if (*temperature < 0) {
    problem = "--temperature must be 0 or more";
  } else if (*max_context < 0) {
    problem = "--max-context must be 0 (the engine's) or more";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "cedar chat: %s\n%s", problem.c_str(), kUsage);
    return 2;
  }
  setup.max_context = static_cast<int>(*max_context);
  const auto numerics = ops::parse_numerics(args->get_or("--numerics", "fast"));
  if (!numerics) {
    std::fprintf(stderr, "cedar chat: --numerics must be 'fast' or 'exact'\n");
    return 2;
  }
  setup.numerics = *numerics;
  const auto speculative = runtime::parse_speculative_mode(args->get_or("--speculative", "off"));
  if (!speculative) {
    std::fprintf(stderr, "cedar chat: --speculative must be 'auto', 'on' or 'off'\n");
    return 2;
  }
  setup.speculative = *speculative;
  if (Status st = residency_from_flags(*args, setup.model_dir, &setup.residency, &setup.auto_budget); !st.ok()) {
    std::fprintf(stderr, "cedar chat: %s\n", st.message().c_str());
    return 2;
  }
  if (Status st = kv_tier_from_flags(*args, &setup.kv_tier); !st.ok()) {
    std::fprintf(stderr, "cedar chat: %s\n", st.message().c_str());
    return 2;
  }

  ChatState state;
  state.request.reasoning.thinking = thinking == "on";
  state.request.sampling.max_tokens = static_cast<int>(*max_tokens);
  state.request.sampling.temperature = static_cast<float>(*temperature);
  if (args->has("--effort") && !run_command("/effort " + *args->get("--effort"), &state)) return 2;
  if (args->has("--system")) run_command("/system " + *args->get("--system"), &state);
  if (args->has("--thinking")) state.request.reasoning.thinking = thinking == "on";

  auto opened = serve::open_serving_engine(setup);
  if (!opened.ok()) {
    std::fprintf(stderr, "cedar chat: %s\n", opened.status().message().c_str());
    return 1;
  }
  serve::ReplayStore replay;
  serve::ServiceConfig config;
  config.model_id = opened->engine->info().model_id;
  serve::ChatService service(*opened->tokenizer, *opened->engine, replay, config);
  signal(SIGINT, on_sigint);

  const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  if (tty) std::printf("cedar chat: %s. /help for commands, Ctrl-D to leave.\n", opened->description.c_str());
  std::string line;
  for (;;) {
    if (tty) std::printf("\n> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line[0] == '/') {
      if (!run_command(line, &state)) break;
      continue;
    }
    state.request.messages.push_back(serve::Message{serve::Role::kUser, line, "", {}, ""});
    auto prepared = service.prepare_chat(state.request, "chat-", "call_");
    if (const serve::ApiError* e = std::get_if<serve::ApiError>(&prepared)) {
      std::printf("[error] %s\n", e->message.c_str());
      state.request.messages.pop_back();
      continue;
    }
    auto& generation = std::get<serve::PreparedGeneration>(prepared);
    auto task = service.submit(generation);
    if (const serve::ApiError* e = std::get_if<serve::ApiError>(&task)) {
      std::printf("[error] %s\n", e->message.c_str());
      state.request.messages.pop_back();
      continue;
    }
    g_interrupted.store(false);
    TerminalSink sink(tty);
    Timer timer;
    auto outcome = service.follow(generation, *std::get<std::shared_ptr<runtime::GenerationStream>>(task), &sink,
                                  [&](bool) {
                                    const std::string text = sink.take();
                                    std::fwrite(text.data(), 1, text.size(), stdout);
                                    std::fflush(stdout);
                                    return !g_interrupted.load();
                                  });
    const serve::Completion* turn = std::get_if<serve::Completion>(&outcome);
    if (!turn) {
      state.request.messages.pop_back();
      continue;
    }
    std::printf("\n");
    if (tty)
      std::printf("\x1b[2m[%d prompt tokens (%d cached), %d generated, %.1f tok/s%s]\x1b[0m\n",
                  turn->usage.prompt_tokens, turn->usage.cached_tokens, turn->usage.completion_tokens,
                  turn->usage.completion_tokens / std::max(timer.seconds(), 1e-9),
                  turn->finish == serve::FinishKind::kCancelled ? ", interrupted" : "");
    serve::Message answer{serve::Role::kAssistant, turn->content, turn->reasoning, turn->tool_calls, ""};
    state.request.messages.push_back(std::move(answer));
  }
  if (tty) std::printf("\n");
  return 0;
}

}  // namespace

CEDAR_COMMAND("chat", "interactive terminal chat with a model (history, thinking, effort)", cmd_chat);

}  // namespace cedar::cli
