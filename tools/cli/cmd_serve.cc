// cedar serve: the OpenAI- and Anthropic-compatible HTTP server (docs/SERVER.md).
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include "args.h"
#include "kv_tier_flags.h"
#include "residency_flags.h"
#include "command.h"
#include "cedar/platform.h"
#include "cedar/server.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar serve (-m DIR | --scripted FILE --tokenizer DIR) [options]\n"
    "  -m, --model DIR          checkpoint directory (config.json, safetensors, tokenizer.json)\n"
    "  --scripted FILE          play the completions of a script file instead of a model (test hook;\n"
    "                           see docs/SERVER.md)\n"
    "  --tokenizer DIR          tokenizer.json directory (default: the model directory)\n"
    "  --host ADDR              address to bind (default 127.0.0.1: this machine only)\n"
    "  --port N                 TCP port (default 8000; 0 picks a free one)\n"
    "  --api-key-file FILE      require the key in FILE (first line; Authorization: Bearer / x-api-key)\n"
    "  --api-key KEY            the same, given inline (visible to other users in `ps`: prefer the file\n"
    "                           or the CEDAR_API_KEY environment variable, the default source)\n"
    "                           Without a key only JSON POSTs addressed to localhost/127.0.0.1/[::1]\n"
    "                           (Host and Origin) are answered\n"
    "  --allow-remote-origins   without a key, answer any Host/Origin and content type anyway\n"
    "  --max-concurrent-per-key N  generation requests in flight per key (default 0 = no limit; 429)\n"
    "  --max-tokens-per-minute-per-key N  prompt + output-budget tokens per key and minute (the unused\n"
    "                           output is given back), refilled continuously (default 0 = no limit; 429)\n"
    "  --max-connections N      open connections before new ones get 503 (default 2048)\n"
    "  --max-connections-per-client N  open connections per client IP address before new ones get 429\n"
    "                           (default 256; 0 = no limit; behind a proxy every client shares its address)\n"
    "  --served-model-name NAME model id reported by /v1/models (default: the checkpoint's name)\n"
    "  --parallel N             sequences the engine advances together (default 16)\n"
    "  --queue N                requests waiting behind them before 429 (default 64)\n"
    "  --prefill-chunk N        prompt tokens prefilled per engine step, so that a long prompt does not\n"
    "                           stall the running sequences (default 512; 0 = whole prompts)\n"
    "  --max-context N          prompt + output tokens per request (default: the engine's)\n"
    "  --max-prompt-tokens N    longest prompt accepted (default: the context)\n"
    "  --max-tokens N           output budget when a request names none, and the most it may name (a larger\n"
    "                           max_tokens is clamped to it; default 4096)\n"
    "  --max-body-bytes N       largest request body (default 16777216)\n"
    "  --max-images N           images per request (default 16; 0 refuses images; base64 data URLs only)\n"
    "  --max-image-tokens N     image-span tokens per request (default 0: only the context bounds them)\n"
    "  --max-body-bytes-in-flight SIZE  request-body bytes held at once, all connections together; a body\n"
    "                           that would pass it gets 503 + Retry-After (default 256M; 0 = no limit)\n"
    "  --thinking on|off        mode when a request does not choose (default on, as DeepSeek's API;\n"
    "                           off = chat mode, faster on a CPU)\n"
    "  --threads N              engine compute threads (default: all cores)\n"
    "  --cache-dir DIR          durable prefix cache: conversations survive restarts\n"
    "  --replay MODE            after a prefix hit: bounded (default) or full (exact recompute)\n"
    "  --numerics MODE          fast (default) or exact (the bit-exact numerics contract)\n"
    "  --speculative MODE       off (default), on or auto: a request running alone drafts with the\n"
    "                           checkpoint's DSpark head and verifies the drafts in one pass\n"
    "  --kv-memory SIZE         limit on running sequences' KV state, e.g. 8G, 512M or bytes (default:\n"
    "                           a quarter of the RAM); requests wait for room, larger ones get 400\n"
    "  --memory-budget SIZE     RAM for weights, e.g. 64G (default: what the machine can spare beside\n"
    "                           --kv-memory); what does not fit streams from the SSD (docs/STREAMING.md)\n"
    "  --residency-stats PATH   routing statistics for warm restarts (default DIR/.cedar-expert-stats;\n"
    "                           ~/.cache/cedar/ when DIR is read-only; 'none' keeps none)\n"
    "  --grammar-cache SIZE     memory for compiled output constraints, least recently used first out\n"
    "                           (default 256M); one constraint may take a quarter of it\n"
    "  --grammar-compile-timeout S  longest a constraint may take to compile (default 10; 400 past it)\n"
    "  --grammar-compile-threads N  constraints compiled at once, off the request threads (default 2)\n";

// "8G", "512M", "64K" or plain bytes.
Result<uint64_t> size_flag(const Args& args, const char* flag) {
  const std::string v = args.get_or(flag, "");
  if (v.empty()) return uint64_t{0};
  size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = v.substr(used);
  const uint64_t mult = unit.empty() ? 1 : unit == "K" || unit == "k" ? 1ull << 10 : unit == "M" || unit == "m" ? 1ull << 20
                        : unit == "G" || unit == "g" ? 1ull << 30 : unit == "T" || unit == "t" ? 1ull << 40 : 0;
  if (used == 0 || mult == 0 || n == 0 || n > (UINT64_MAX / mult))
    return invalid_argument(std::string(flag) + " must be a positive size such as 8G, 512M or 1048576, got '" + v + "'");
  return static_cast<uint64_t>(n) * mult;
}

Result<int> int_flag(const Args& args, const char* flag, long long fallback, long long lo, long long hi) {
  CEDAR_ASSIGN_OR_RETURN(long long v, args.get_int(flag, fallback));
  if (v < lo || v > hi)
    return invalid_argument(std::string(flag) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(v);
}

// The API key from --api-key-file, --api-key or CEDAR_API_KEY (in that order; at most one of the
// flags). An empty key is an error rather than "no authentication": it is what an unset shell
// variable expands to, and silently serving without the key the operator meant to set is worse.
Result<std::string> api_key(const Args& args) {
  if (args.has("--api-key") && args.has("--api-key-file"))
    return invalid_argument("give --api-key or --api-key-file, not both");
  if (args.has("--api-key-file")) {
    const std::string path = args.get_or("--api-key-file", "");
    std::ifstream in(path);
    if (!in) return invalid_argument("--api-key-file '" + path + "' cannot be read; give a file holding the key");
    std::string key;
    std::getline(in, key);
    // The file's first line, less a UTF-8 byte-order mark and the line's end (CR LF, blanks): what
    // editors add, not part of the key (docs/SERVER.md).
    if (key.rfind("\xEF\xBB\xBF", 0) == 0) key.erase(0, 3);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
    if (key.empty())
      return invalid_argument("--api-key-file '" + path + "' starts with an empty line; put the key on its first line");
    if (std::optional<std::string> problem = serve::api_key_problem(key))
      return invalid_argument("the key in --api-key-file '" + path + "' " + *problem);
    return key;
  }
  if (args.has("--api-key")) {
    std::string key = args.get_or("--api-key", "");
    if (key.empty())
      return invalid_argument(
          "--api-key is empty; give a non-empty key (better: --api-key-file FILE or the CEDAR_API_KEY environment "
          "variable, which `ps` does not show), or leave the flag out to serve without a key on loopback");
    if (std::optional<std::string> problem = serve::api_key_problem(key))
      return invalid_argument("--api-key " + *problem);
    return key;
  }
  if (const char* env = std::getenv("CEDAR_API_KEY")) {
    if (*env == '\0')
      return invalid_argument("CEDAR_API_KEY is set but empty; set it to the key, or unset it to serve without a key");
    if (std::optional<std::string> problem = serve::api_key_problem(env))
      return invalid_argument("CEDAR_API_KEY " + *problem);
    return std::string(env);
  }
  return std::string();
}

// Every connection holds a descriptor; Debian's default soft limit (1024) is below the default
// --max-connections, so the soft limit is raised towards the hard one.
void raise_descriptor_limit(size_t max_connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = static_cast<rlim_t>(max_connections) + 256;
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < wanted)
    CEDAR_LOG_WARN("serve: the descriptor limit (%llu) is below --max-connections + 256; raise `ulimit -n`",
                   static_cast<unsigned long long>(limit.rlim_cur));
}

struct ServeConfig {
  serve::EngineSetup engine;
  serve::ServerOptions server;
  std::string served_name;
};

Result<ServeConfig> read_flags(const Args& args) {
  ServeConfig c;
  c.engine.model_dir = args.get_or("--model", "");
  c.engine.script_path = args.get_or("--scripted", "");
  c.engine.tokenizer_dir = args.get_or("--tokenizer", "");
  c.engine.cache_dir = args.get_or("--cache-dir", "");
  CEDAR_RETURN_IF_ERROR(kv_tier_from_flags(args, &c.engine.kv_tier));
  const std::string replay = args.get_or("--replay", "bounded");
  if (replay != "bounded" && replay != "full") return invalid_argument("--replay must be 'bounded' or 'full'");
  c.engine.replay_full = replay == "full";
  const auto numerics = ops::parse_numerics(args.get_or("--numerics", "fast"));
  if (!numerics) return invalid_argument("--numerics must be 'fast' or 'exact'");
  c.engine.numerics = *numerics;
  const auto speculative = runtime::parse_speculative_mode(args.get_or("--speculative", "off"));
  if (!speculative) return invalid_argument("--speculative must be 'auto', 'on' or 'off'");
  c.engine.speculative = *speculative;
  CEDAR_ASSIGN_OR_RETURN(c.engine.kv_memory_bytes, size_flag(args, "--kv-memory"));
  CEDAR_RETURN_IF_ERROR(residency_from_flags(args, c.engine.model_dir, &c.engine.residency, &c.engine.auto_budget));
  CEDAR_ASSIGN_OR_RETURN(c.engine.max_context, int_flag(args, "--max-context", 0, 0, 1 << 24));
  CEDAR_ASSIGN_OR_RETURN(c.engine.threads, int_flag(args, "--threads", 0, 0, 4096));
  CEDAR_ASSIGN_OR_RETURN(c.engine.max_batch, int_flag(args, "--parallel", 16, 1, 4096));
  CEDAR_ASSIGN_OR_RETURN(c.engine.max_queue, int_flag(args, "--queue", 64, 0, 1 << 20));
  CEDAR_ASSIGN_OR_RETURN(c.engine.prefill_chunk, int_flag(args, "--prefill-chunk", 512, 0, 1 << 24));
  c.server.max_waiting = c.engine.max_queue;
  c.server.host = args.get_or("--host", "127.0.0.1");
  CEDAR_ASSIGN_OR_RETURN(c.server.port, int_flag(args, "--port", 8000, 0, 65535));
  CEDAR_ASSIGN_OR_RETURN(c.server.api_key, api_key(args));
  c.server.allow_remote_origins = args.has("--allow-remote-origins");
  CEDAR_ASSIGN_OR_RETURN(c.server.max_concurrent_per_key, int_flag(args, "--max-concurrent-per-key", 0, 0, 1 << 20));
  CEDAR_ASSIGN_OR_RETURN(c.server.max_tokens_per_minute_per_key,
                         int_flag(args, "--max-tokens-per-minute-per-key", 0, 0, 1 << 30));
  CEDAR_ASSIGN_OR_RETURN(int max_connections, int_flag(args, "--max-connections", 2048, 1, 1 << 20));
  c.server.max_connections = static_cast<size_t>(max_connections);
  CEDAR_ASSIGN_OR_RETURN(long long body, args.get_int("--max-body-bytes", 16 << 20));
  if (body < 1024) return invalid_argument("--max-body-bytes must be at least 1024");
  c.server.max_body_bytes = static_cast<size_t>(body);
  CEDAR_ASSIGN_OR_RETURN(c.server.service.max_prompt_tokens, int_flag(args, "--max-prompt-tokens", 0, 0, 1 << 24));
  CEDAR_ASSIGN_OR_RETURN(c.server.service.images.max_images, int_flag(args, "--max-images", 16, 0, 4096));
  CEDAR_ASSIGN_OR_RETURN(c.server.service.images.max_image_tokens, int_flag(args, "--max-image-tokens", 0, 0, 1 << 24));
  CEDAR_ASSIGN_OR_RETURN(c.server.service.default_max_tokens, int_flag(args, "--max-tokens", 4096, 1, 1 << 24));
  // A request's per-minute cost includes its whole output budget (rate_limit.h), so one that asked
  // for --max-tokens could never run.
  if (c.server.max_tokens_per_minute_per_key > 0 &&
      c.server.service.default_max_tokens >= c.server.max_tokens_per_minute_per_key)
    return invalid_argument("--max-tokens (" + std::to_string(c.server.service.default_max_tokens) +
                            ") must be below --max-tokens-per-minute-per-key (" +
                            std::to_string(c.server.max_tokens_per_minute_per_key) +
                            "): a request's output budget is counted against the per-minute budget; lower "
                            "--max-tokens or raise the per-minute limit");
  CEDAR_ASSIGN_OR_RETURN(int per_client, int_flag(args, "--max-connections-per-client", 256, 0, 1 << 20));
  c.server.max_connections_per_client = static_cast<size_t>(per_client);
  if (args.get_or("--max-body-bytes-in-flight", "") == "0") {
    c.server.max_body_bytes_in_flight = 0;
  } else if (args.has("--max-body-bytes-in-flight")) {
    CEDAR_ASSIGN_OR_RETURN(c.server.max_body_bytes_in_flight, size_flag(args, "--max-body-bytes-in-flight"));
  }
  if (c.server.max_body_bytes_in_flight > 0 && c.server.max_body_bytes_in_flight < c.server.max_body_bytes)
    return invalid_argument("--max-body-bytes-in-flight must be 0 (no limit) or at least --max-body-bytes (" +
                            std::to_string(c.server.max_body_bytes) + "), or no body of the largest size could be read");
  const std::string thinking = args.get_or("--thinking", "on");
  if (thinking != "on" && thinking != "off") return invalid_argument("--thinking must be on or off");
  c.server.service.default_thinking = thinking == "on";
  c.served_name = args.get_or("--served-model-name", "");
  constrain::GrammarEngineOptions& grammar = c.server.service.grammar;
  CEDAR_ASSIGN_OR_RETURN(const uint64_t grammar_cache, size_flag(args, "--grammar-cache"));
  if (grammar_cache > 0) grammar.cache_bytes = static_cast<int64_t>(std::min<uint64_t>(grammar_cache, INT64_MAX));
  CEDAR_ASSIGN_OR_RETURN(grammar.compile.timeout_seconds, args.get_double("--grammar-compile-timeout", 10));
  if (!(grammar.compile.timeout_seconds > 0 && grammar.compile.timeout_seconds <= 3600))
    return invalid_argument("--grammar-compile-timeout must be in (0, 3600] seconds");
  CEDAR_ASSIGN_OR_RETURN(grammar.compile.threads, int_flag(args, "--grammar-compile-threads", 2, 1, 64));
  return c;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

int cmd_serve(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv,
                          {"--model", "--scripted", "--tokenizer", "--host", "--port", "--api-key", "--api-key-file",
                           "--max-concurrent-per-key", "--max-tokens-per-minute-per-key", "--max-connections",
                           "--served-model-name", "--parallel", "--queue", "--prefill-chunk", "--max-context", "--max-prompt-tokens",
                           "--max-tokens", "--max-body-bytes", "--max-body-bytes-in-flight", "--max-connections-per-client",
                           "--max-images", "--max-image-tokens",
                           "--thinking", "--threads", "--cache-dir", "--replay", "--kv-memory", "--numerics", "--speculative",
                           "--memory-budget", "--residency-stats", "--grammar-cache", "--grammar-compile-timeout",
                           "--grammar-compile-threads", kKvTierFlags[0], kKvTierFlags[1], kKvTierFlags[2]},
                          {"--help", "--allow-remote-origins"}, {{"-m", "--model"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar serve: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s%s", kUsage, kKvTierUsage);
    return 0;
  }
  auto config = read_flags(*args);
  if (!config.ok()) {
    std::fprintf(stderr, "cedar serve: %s\n%s", config.status().message().c_str(), kUsage);
    return 2;
  }
  if (config->engine.model_dir.empty() == config->engine.script_path.empty()) {
    std::fprintf(stderr, "cedar serve: give exactly one of -m DIR or --scripted FILE\n%s", kUsage);
    return 2;
  }

  // SIGINT / SIGTERM are taken by a watcher thread (sigwait) rather than a handler, so shutting the
  // server down runs as ordinary code. Blocked before any thread starts, so every thread inherits it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (args->has("--api-key"))
    CEDAR_LOG_WARN("serve: a key given with --api-key is visible to every user of this machine in `ps`; "
                   "prefer --api-key-file FILE or CEDAR_API_KEY");
  raise_descriptor_limit(config->server.max_connections);

  auto opened = serve::open_serving_engine(config->engine);
  if (!opened.ok()) {
    std::fprintf(stderr, "cedar serve: %s\n", opened.status().message().c_str());
    return 1;
  }
  serve::ServerOptions options = config->server;
  options.service.model_id = config->served_name.empty() ? opened->engine->info().model_id : config->served_name;
  serve::ApiServer server(*opened->engine, *opened->tokenizer, options);
  auto port = server.bind();
  if (!port.ok()) {
    std::fprintf(stderr, "cedar serve: %s\n", port.status().message().c_str());
    return 1;
  }
  if (!is_loopback(options.host) && options.api_key.empty())
    CEDAR_LOG_WARN("serve: listening on %s without an API key: %s", options.host.c_str(),
                   options.allow_remote_origins
                       ? "anyone who can reach it can use the model"
                       : "only requests addressed to localhost are answered (--allow-remote-origins opens it)");
  std::printf("cedar serve: %s as '%s' on http://%s:%d (%d in parallel, %d queued; Ctrl-C stops)\n",
              opened->description.c_str(), options.service.model_id.c_str(), options.host.c_str(), *port,
              config->engine.max_batch, config->engine.max_queue);
  std::fflush(stdout);

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    const timespec tick{0, 200'000'000};
    while (!done.load()) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        std::printf("cedar serve: stopping\n");
        std::fflush(stdout);
        server.stop();
        return;
      }
    }
  });
  Status served = server.serve();
  done.store(true);
  watcher.join();
  server.stop();
  if (!served.ok()) {
    std::fprintf(stderr, "cedar serve: %s\n", served.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("serve", "OpenAI / Anthropic compatible HTTP server (chat, responses, messages)", cmd_serve);

}  // namespace cedar::cli
