// cedar generate: run a prompt through the model and stream the continuation.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "args.h"
#include "command.h"
#include "expert_parallel.h"
#include "cedar/platform.h"
#include "cedar/model.h"
#include "progress.h"
#include "kv_tier_flags.h"
#include "residency_flags.h"
#include "cedar/engine.h"
#include "cedar/prompt.h"
#include "cedar/tokenizer.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar generate -m DIR (-p TEXT | --prompt-ids 1,2,3) [options]\n"
    "  -m, --model DIR        checkpoint directory\n"
    "  -p, --prompt TEXT      prompt text (tokenized with the checkpoint's tokenizer, BOS per its config)\n"
    "  --prompt-ids IDS       comma-separated token ids instead of text\n"
    "  --image FILE           an image (PNG, JPEG, WebP, GIF; repeatable): each <｜deepseek_image｜> of the\n"
    "                         prompt takes the next one; with no placeholder the images go before the text\n"
    "  -n, --n-predict N      new tokens at most (default 32)\n"
    "  --temperature T        0 = greedy (default 0)\n"
    "  --seed S               sampler seed (default 0)\n"
    "  --threads K            worker threads (default: all cores)\n"
    "  --numerics MODE        fast (default: fp32 sums in registers, bounded difference) or exact\n"
    "                         (the numerics contract, bit-identical to the golden reference)\n"
    "  --index-keys MODE      reference (default: the official code's index-key slot) or owner\n"
    "  --prefill-chunk N      prefill in chunks of N tokens (default: one call)\n"
    "  --ignore-eos           keep generating after the end-of-sequence token\n"
    "  --cache-dir DIR        durable prefix cache: resume from it and save prompt + output to it\n"
    "  --replay MODE          after a cache hit: bounded (default; replay the last window of tokens)\n"
    "                         or full (recompute the whole prompt; exact)\n"
    "  --decoder-narrowing    prefill the layers after the last KV source on the last window only\n"
    "  --speculative MODE     off (default), on or auto (on when the checkpoint has DSpark stages): the\n"
    "                         draft head proposes up to 5 tokens and one pass verifies them (docs/DSPARK.md)\n"
    "  --json                 print {\"prompt_ids\", \"ids\", \"text\"} instead of streaming text\n"
    "  --top-logprobs K       with --json: \"logprobs\", per generated token its log-probability and the K\n"
    "                         most probable ids with theirs (log-softmax of the fp32 logits, 1 <= K <= 100)\n";

// The files of --image, refused by name when unreadable or over the decoder's byte limit.
Result<std::vector<serve::EncodedImage>> read_images(const std::vector<std::string>& files) {
  const size_t max_bytes = image::ImageLimits{}.max_bytes;
  std::vector<serve::EncodedImage> out;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(f, ec);
    if (ec) return invalid_argument("--image " + f + ": cannot read the file (" + ec.message() + ")");
    if (size > max_bytes)
      return invalid_argument("image '" + f + "': " + std::to_string(size) + " bytes exceed the limit of " +
                              std::to_string(max_bytes) + " bytes per image; send a smaller image");
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes(size);
    if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
      return invalid_argument("--image " + f + ": cannot read the file");
    out.push_back({f, std::move(bytes)});
  }
  return out;
}

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0 || v > INT32_MAX) return invalid_argument("--prompt-ids: bad id '" + item + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return invalid_argument("--prompt-ids: no ids given");
  return ids;
}

int fail(const Status& st) {
  std::fprintf(stderr, "cedar generate: %s\n", st.message().c_str());
  return 1;
}

int cmd_generate(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv,
                          {"--model", "--prompt", "--prompt-ids", "--n-predict", "--temperature", "--seed",
                           "--threads", "--numerics", "--index-keys", "--prefill-chunk", "--cache-dir", "--replay",
                           "--top-logprobs", "--memory-budget", "--residency-stats", "--speculative", kKvTierFlags[0],
                           kKvTierFlags[1], kKvTierFlags[2], kExpertParallelFlags[0]},
                          {"--json", "--ignore-eos", "--decoder-narrowing", "--expert-parallel", "--help"},
                          {{"-m", "--model"}, {"-p", "--prompt"}, {"-n", "--n-predict"}}, {"--image"});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar generate: %s\n", args.status().message().c_str());
    std::fprintf(stderr, "%s%s", kUsage, kResidencyUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s%s%s%s", kUsage, kResidencyUsage, kKvTierUsage, kExpertParallelUsage);
    return 0;
  }
  if (!args->has("--model") || args->has("--prompt") == args->has("--prompt-ids")) {
    std::fprintf(stderr, "cedar generate: need -m DIR and exactly one of -p TEXT / --prompt-ids\n");
    std::fprintf(stderr, "%s%s", kUsage, kResidencyUsage);
    return 2;
  }
  auto n = args->get_int("--n-predict", 32);
  auto temp = args->get_double("--temperature", 0.0);
  auto seed = args->get_int("--seed", 0);
  auto threads = args->get_int("--threads", 0);
  auto chunk = args->get_int("--prefill-chunk", 0);
  auto top_logprobs = args->get_int("--top-logprobs", 0);
  for (const Status* st : {&n.status(), &temp.status(), &seed.status(), &threads.status(), &chunk.status(),
                           &top_logprobs.status()})
    if (!st->ok()) {
      std::fprintf(stderr, "cedar generate: %s\n", st->message().c_str());
      return 2;
    }
  if (*n < 0 || *temp < 0 || *threads < 0 || *chunk < 0) {
    std::fprintf(stderr, "cedar generate: -n, --temperature, --threads and --prefill-chunk must be >= 0\n");
    return 2;
  }
  if (args->has("--top-logprobs") && (*top_logprobs < 1 || *top_logprobs > runtime::kMaxTopLogprobs)) {
    std::fprintf(stderr, "cedar generate: --top-logprobs must be between 1 and 20\n");
    return 2;
  }
  if (args->has("--top-logprobs") && !args->has("--json")) {
    std::fprintf(stderr, "cedar generate: --top-logprobs reports in the JSON output: add --json\n");
    return 2;
  }
  model::ModelOptions mopts;
  const std::string mode = args->get_or("--index-keys", "reference");
  if (mode == "owner") mopts.index_keys = model::IndexKeyMode::kOwner;
  else if (mode != "reference") {
    std::fprintf(stderr, "cedar generate: --index-keys must be 'reference' or 'owner'\n");
    return 2;
  }
  mopts.decoder_narrowing = args->has("--decoder-narrowing");
  const auto numerics = ops::parse_numerics(args->get_or("--numerics", "fast"));
  if (!numerics) {
    std::fprintf(stderr, "cedar generate: --numerics must be 'fast' or 'exact'\n");
    return 2;
  }
  mopts.numerics = *numerics;
  const std::string replay = args->get_or("--replay", "bounded");
  if (replay != "bounded" && replay != "full") {
    std::fprintf(stderr, "cedar generate: --replay must be 'bounded' or 'full'\n");
    return 2;
  }
  const auto speculative = runtime::parse_speculative_mode(args->get_or("--speculative", "off"));
  if (!speculative) {
    std::fprintf(stderr, "cedar generate: --speculative must be 'auto', 'on' or 'off'\n");
    return 2;
  }
  const std::string dir = *args->get("--model");
  if (Status st = residency_from_flags(*args, dir, &mopts.residency); !st.ok()) {
    std::fprintf(stderr, "cedar generate: %s\n", st.message().c_str());
    return 2;
  }
  // Expert parallelism: a worker rank serves the head inside this call and exits.
  auto expert_parallel = start_expert_parallel(*args, dir, &mopts, args->has("--memory-budget"));
  if (!expert_parallel.ok()) return fail(expert_parallel.status());
  ProgressBar load_bar("mapping checkpoint");
  mopts.progress = [&](const io::CheckpointProgress& p) { load_bar.update(p.bytes_done, p.bytes_total); };
  auto model = model::Model::load(dir, mopts);
  load_bar.finish();
  if (!model.ok()) return fail(model.status());
  if (*expert_parallel) (*expert_parallel)->attach(**model);
  print_residency_line(**model);
  auto tok = tokenizer::Tokenizer::load_dir(dir);
  if (!tok.ok()) return fail(tok.status());

  std::vector<int32_t> prompt;
  if (args->has("--prompt-ids")) {
    auto ids = parse_ids(*args->get("--prompt-ids"));
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  } else {
    auto ids = (*tok)->encode(*args->get("--prompt"), /*add_special=*/true);
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  }
  std::shared_ptr<model::SequenceImages> images;
  if (const auto files = args->get_list("--image"); !files.empty()) {
    auto encoded = read_images(files);
    if (!encoded.ok()) return fail(encoded.status());
    const int32_t image_id = (*model)->config().image_token_id;
    if (std::count(prompt.begin(), prompt.end(), image_id) == 0) {  // no placeholder: the images come first
      const size_t at = !prompt.empty() && prompt[0] == (*model)->config().bos_token_id ? 1 : 0;
      prompt.insert(prompt.begin() + static_cast<std::ptrdiff_t>(at), encoded->size(), image_id);
    }
    auto spans = serve::expand_image_placeholders(prompt, *encoded, image_id, (*model)->config().vision, {});
    if (!spans.ok()) return fail(spans.status());
    images = std::move(*spans);
  }
  if (*n == 0) return 0;  // nothing to generate
  if (*threads > 0) ThreadPool::set_default_threads(static_cast<int>(*threads));
  const bool json = args->has("--json");

  // cedar's one decode loop: the engine's scheduler, here for one request.
  runtime::EngineOptions eopts;
  eopts.max_batch = 1;
  eopts.max_queue = 0;
  eopts.max_context = static_cast<int>(prompt.size() + *n + 1);
  eopts.threads = static_cast<int>(*threads);
  eopts.prefill_chunk = static_cast<int>(*chunk);
  eopts.prefix_cache = args->has("--cache-dir") || args->has("--kv-tier");
  eopts.cache_dir = args->get_or("--cache-dir", "");
  if (Status st = kv_tier_from_flags(*args, &eopts.kv_tier); !st.ok()) return fail(st);
  eopts.replay_full = replay == "full";
  eopts.speculative = *speculative;
  runtime::GenerationRequest request;
  request.prompt_ids = prompt;
  request.images = images;
  request.sampling.max_tokens = static_cast<int>(*n);
  request.sampling.temperature = static_cast<float>(*temp);
  request.sampling.seed = static_cast<uint64_t>(*seed);
  request.sampling.ignore_eos = args->has("--ignore-eos");
  request.logprobs = *top_logprobs > 0;
  request.top_logprobs = static_cast<int>(std::min<int64_t>(*top_logprobs, runtime::kMaxTopLogprobs));

  // Stream text: print what the decoded output gained, holding back an incomplete UTF-8 tail.
  std::vector<int32_t> so_far;
  size_t printed = 0;
  runtime::TokenLogprobs logprobs;
  ProgressBar prefill_bar("prefill");
  std::atomic<bool> first_token{false};
  const int n_layers = (*model)->config().n_layers;
  (*model)->set_layer_observer([&](int layer, const float*, size_t) {  // on the engine's thread
    if (!first_token.load(std::memory_order_relaxed)) prefill_bar.update(layer + 1, n_layers);
  });
  auto engine = runtime::make_engine(std::move(*model), eopts, "");
  if (!engine.ok()) return fail(engine.status());
  auto on_update = [&](const runtime::GenerationStream::Update& u) {
    if (!u.tokens.empty() && !first_token.exchange(true)) prefill_bar.finish();
    so_far.insert(so_far.end(), u.tokens.begin(), u.tokens.end());
    if (u.logprobs.size() > 0) {
      logprobs.k = u.logprobs.k;
      logprobs.logprob.insert(logprobs.logprob.end(), u.logprobs.logprob.begin(), u.logprobs.logprob.end());
      logprobs.top_ids.insert(logprobs.top_ids.end(), u.logprobs.top_ids.begin(), u.logprobs.top_ids.end());
      logprobs.top_logprobs.insert(logprobs.top_logprobs.end(), u.logprobs.top_logprobs.begin(),
                                   u.logprobs.top_logprobs.end());
    }
    if (json) return true;
    auto text = (*tok)->decode(so_far, /*skip_special=*/false);
    if (text.ok() && text->size() > printed && text->find("\xEF\xBF\xBD", printed) == std::string::npos) {
      std::fwrite(text->data() + printed, 1, text->size() - printed, stdout);
      std::fflush(stdout);
      printed = text->size();
    }
    return true;
  };
  auto result = runtime::generate(**engine, std::move(request), on_update);
  if (!result.ok()) return fail(result.status());
  const std::vector<int32_t>& out = result->output_ids;
  auto text = (*tok)->decode(out, /*skip_special=*/false);
  if (!text.ok()) return fail(text.status());
  const int64_t computed = result->prompt_tokens - result->cached_tokens + result->replayed_tokens;
  if (json) {
    nlohmann::json j = {{"prompt_ids", prompt}, {"ids", out}, {"text", *text}};
    if (*top_logprobs > 0) {
      const auto& lp = logprobs;
      auto token_text = [&](int32_t id) {
        auto t = (*tok)->decode(std::vector<int32_t>{id}, /*skip_special=*/false);
        return t.ok() ? *t : std::string();
      };
      nlohmann::json arr = nlohmann::json::array();
      for (size_t i = 0; i < out.size() && i < lp.size(); ++i) {
        nlohmann::json top = nlohmann::json::array();
        for (int k = 0; k < lp.k; ++k) {
          const int32_t id = lp.top_ids[i * lp.k + k];
          top.push_back({{"id", id}, {"token", token_text(id)}, {"logprob", lp.top_logprobs[i * lp.k + k]}});
        }
        arr.push_back({{"id", out[i]}, {"token", token_text(out[i])}, {"logprob", lp.logprob[i]}, {"top", top}});
      }
      j["logprobs"] = arr;
    }
    if (*speculative != runtime::SpeculativeMode::kOff)
      j["speculative"] = {{"verify_passes", result->verify_passes},
                          {"drafted", result->drafted_tokens},
                          {"accepted", result->accepted_tokens},
                          {"mean_accepted_length", result->verify_passes > 0 ? static_cast<double>(result->accepted_tokens) /
                                                                                  result->verify_passes
                                                                            : 0.0}};
    if (eopts.prefix_cache)
      j["cache"] = {{"cached_tokens", result->cached_tokens}, {"replayed_tokens", result->replayed_tokens},
                    {"computed_tokens", computed}, {"prefill_seconds", result->prefill_seconds}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    if (printed < text->size()) std::fwrite(text->data() + printed, 1, text->size() - printed, stdout);
    // The completion ends its line, and reaches the terminal or pipe before the speed line on
    // stderr (stdout is fully buffered when it is not a terminal).
    if (text->empty() || text->back() != '\n') std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  if (eopts.prefix_cache)
    std::fprintf(stderr, "prefix cache: %d prompt tokens restored, %d replayed, %lld computed\n",
                 result->cached_tokens, result->replayed_tokens, static_cast<long long>(computed));
  const int new_tokens = static_cast<int>(out.size());
  std::fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s); decode: %d tokens in %.3f s (%.2f tok/s); %d threads\n",
               result->prompt_tokens, result->prefill_seconds,
               result->prompt_tokens / std::max(result->prefill_seconds, 1e-9), new_tokens, result->decode_seconds,
               new_tokens > 1 ? (new_tokens - 1) / std::max(result->decode_seconds, 1e-9) : 0.0,
               *threads > 0 ? static_cast<int>(*threads) : hardware_threads());
  if (*speculative != runtime::SpeculativeMode::kOff)
    std::fprintf(stderr, "speculative: %d verify passes, %d drafted, %d accepted (%.2f per pass)\n",
                 result->verify_passes, result->drafted_tokens, result->accepted_tokens,
                 result->verify_passes > 0 ? static_cast<double>(result->accepted_tokens) / result->verify_passes : 0.0);
  // The engine writes the routing statistics (--residency-stats) when it stops.
  return 0;
}

}  // namespace

CEDAR_COMMAND("generate", "generate text from a prompt (streams tokens; --json for ids)", cmd_generate);

}  // namespace cedar::cli
