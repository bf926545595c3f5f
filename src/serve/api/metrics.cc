#include "serve/api/metrics.h"

#include <algorithm>
#include <cstdio>

namespace cedar::serve {

const char* endpoint_name(Endpoint e) {
  switch (e) {
    case Endpoint::kChatCompletions: return "chat_completions";
    case Endpoint::kCompletions: return "completions";
    case Endpoint::kResponses: return "responses";
    case Endpoint::kMessages: return "messages";
    case Endpoint::kModels: return "models";
    case Endpoint::kHealth: return "health";
    case Endpoint::kMetrics: return "metrics";
    case Endpoint::kOther: return "other";
  }
  return "other";
}

size_t ServerMetrics::code_slot(int http_status) {
  for (size_t i = 0; i + 1 < kCodes.size(); ++i)
    if (kCodes[i] == http_status) return i;
  return kCodes.size() - 1;
}

void ServerMetrics::count_response(Endpoint endpoint, int http_status) {
  responses_[static_cast<size_t>(endpoint)][code_slot(http_status)].fetch_add(1, std::memory_order_relaxed);
}

void ServerMetrics::count_turn(const Usage& usage, bool client_gone) {
  turns_.fetch_add(1, std::memory_order_relaxed);
  prompt_tokens_.fetch_add(usage.prompt_tokens, std::memory_order_relaxed);
  completion_tokens_.fetch_add(usage.completion_tokens, std::memory_order_relaxed);
  cached_tokens_.fetch_add(usage.cached_tokens, std::memory_order_relaxed);
  reasoning_tokens_.fetch_add(usage.reasoning_tokens, std::memory_order_relaxed);
  if (client_gone) client_disconnects_.fetch_add(1, std::memory_order_relaxed);
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const char* name, const std::string& labels, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += ' ';
  out += buf;
  out += '\n';
}

double rate(double tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0; }

// Prefix-cache hits by level and the shared tier's health (runtime/prefix_levels.h, kv/redis_tier.h).
void render_prefix_levels(std::string& out, const runtime::PrefixLevelStats& p) {
  metric(out, "cedar_prefix_cache_hits_total", "counter",
         "Prefix-cache hits by the deepest level that served part of the prefix (memory, disk, redis).");
  sample(out, "cedar_prefix_cache_hits_total", "level=\"memory\"", static_cast<double>(p.hits_memory));
  sample(out, "cedar_prefix_cache_hits_total", "level=\"disk\"", static_cast<double>(p.hits_disk));
  sample(out, "cedar_prefix_cache_hits_total", "level=\"redis\"", static_cast<double>(p.hits_tier));
  metric(out, "cedar_prefix_cache_tokens_total", "counter", "Prompt tokens restored from the prefix cache, by level.");
  sample(out, "cedar_prefix_cache_tokens_total", "level=\"memory\"", static_cast<double>(p.tokens_memory));
  sample(out, "cedar_prefix_cache_tokens_total", "level=\"disk\"", static_cast<double>(p.tokens_disk));
  sample(out, "cedar_prefix_cache_tokens_total", "level=\"redis\"", static_cast<double>(p.tokens_tier));
  const kv::RedisTierStats& t = p.tier;
  if (!t.configured) return;
  metric(out, "cedar_kv_tier_up", "gauge", "1 while the shared KV tier (Redis) answers, 0 during an outage.");
  sample(out, "cedar_kv_tier_up", "", t.up ? 1 : 0);
  metric(out, "cedar_kv_tier_events_total", "counter",
         "Shared KV tier: lookups, hits, writes, failures (I/O, deadline, error replies), outages and bad values "
         "(each ignored and deleted).");
  const std::pair<const char*, uint64_t> events[] = {{"lookup", t.lookups},
                                                     {"hit_block", t.hit_blocks},
                                                     {"hit_tail", t.hit_tails},
                                                     {"written", t.written_records},
                                                     {"skipped_known", t.skipped_known},
                                                     {"dropped_write", t.dropped_writes},
                                                     {"error", t.errors},
                                                     {"error_reply", t.error_replies},
                                                     {"outage", t.outages},
                                                     {"connect", t.connects},
                                                     {"corrupt", t.corrupt},
                                                     {"foreign", t.foreign},
                                                     {"stale", t.stale},
                                                     {"mismatch", t.mismatch},
                                                     {"deleted", t.deleted}};
  for (const auto& [name, value] : events)
    sample(out, "cedar_kv_tier_events_total", std::string("event=\"") + name + "\"", static_cast<double>(value));
  metric(out, "cedar_kv_tier_bytes_total", "counter", "Bytes of KV records fetched from and written to the tier.");
  sample(out, "cedar_kv_tier_bytes_total", "direction=\"fetched\"", static_cast<double>(t.fetched_bytes));
  sample(out, "cedar_kv_tier_bytes_total", "direction=\"written\"", static_cast<double>(t.written_bytes));
  metric(out, "cedar_kv_tier_hit_tokens_total", "counter", "Prompt tokens the tier's lookups delivered.");
  sample(out, "cedar_kv_tier_hit_tokens_total", "", static_cast<double>(t.hit_tokens));
  metric(out, "cedar_kv_tier_lookup_seconds_total", "counter", "Seconds spent in tier lookups (on the engine thread).");
  sample(out, "cedar_kv_tier_lookup_seconds_total", "", t.lookup_seconds);
  metric(out, "cedar_kv_tier_write_queue", "gauge", "Records and bytes waiting for the tier's writer thread.");
  sample(out, "cedar_kv_tier_write_queue", "unit=\"records\"", static_cast<double>(t.queued_records));
  sample(out, "cedar_kv_tier_write_queue", "unit=\"bytes\"", static_cast<double>(t.queued_bytes));
}

}  // namespace

std::string ServerMetrics::render(const runtime::EngineStats& engine) const {
  std::string out;
  metric(out, "cedar_http_responses_total", "counter", "HTTP responses by endpoint and status code.");
  for (size_t e = 0; e < kEndpointCount; ++e) {
    for (size_t c = 0; c < kCodes.size(); ++c) {
      const uint64_t n = responses_[e][c].load(std::memory_order_relaxed);
      if (n == 0) continue;
      const std::string code = kCodes[c] ? std::to_string(kCodes[c]) : "other";
      sample(out, "cedar_http_responses_total",
             std::string("endpoint=\"") + endpoint_name(static_cast<Endpoint>(e)) + "\",code=\"" + code + "\"",
             static_cast<double>(n));
    }
  }
  metric(out, "cedar_turns_total", "counter", "Generations that produced a response (any API).");
  sample(out, "cedar_turns_total", "", static_cast<double>(turns_.load()));
  metric(out, "cedar_client_disconnects_total", "counter", "Streams whose client went away before the end.");
  sample(out, "cedar_client_disconnects_total", "", static_cast<double>(client_disconnects_.load()));
  metric(out, "cedar_tokens_total", "counter", "Tokens billed to clients, by kind.");
  sample(out, "cedar_tokens_total", "kind=\"prompt\"", static_cast<double>(prompt_tokens_.load()));
  sample(out, "cedar_tokens_total", "kind=\"completion\"", static_cast<double>(completion_tokens_.load()));
  sample(out, "cedar_tokens_total", "kind=\"cached_prompt\"", static_cast<double>(cached_tokens_.load()));
  sample(out, "cedar_tokens_total", "kind=\"reasoning\"", static_cast<double>(reasoning_tokens_.load()));

  metric(out, "cedar_engine_requests_total", "counter", "Requests the engine finished.");
  sample(out, "cedar_engine_requests_total", "", static_cast<double>(engine.requests));
  metric(out, "cedar_engine_tokens_total", "counter", "Tokens the engine processed, by kind.");
  sample(out, "cedar_engine_tokens_total", "kind=\"prompt\"", static_cast<double>(engine.prompt_tokens));
  sample(out, "cedar_engine_tokens_total", "kind=\"output\"", static_cast<double>(engine.output_tokens));
  sample(out, "cedar_engine_tokens_total", "kind=\"cached\"", static_cast<double>(engine.cached_tokens));
  sample(out, "cedar_engine_tokens_total", "kind=\"computed_prompt\"",
         static_cast<double>(engine.computed_prompt_tokens));
  sample(out, "cedar_engine_tokens_total", "kind=\"replayed\"", static_cast<double>(engine.replayed_tokens));
  sample(out, "cedar_engine_tokens_total", "kind=\"decode\"", static_cast<double>(engine.decode_tokens));
  metric(out, "cedar_prefill_tokens_per_second", "gauge",
         "Prompt tokens computed (uncached plus replayed) per second of prefill work, all sequences together, "
         "since start.");
  sample(out, "cedar_prefill_tokens_per_second", "",
         rate(static_cast<double>(engine.computed_prompt_tokens), engine.prefill_seconds));
  metric(out, "cedar_decode_tokens_per_second", "gauge",
         "Decode tokens per second of decode work, all sequences together, since start.");
  sample(out, "cedar_decode_tokens_per_second", "", rate(static_cast<double>(engine.decode_tokens), engine.decode_seconds));
  metric(out, "cedar_speculative_tokens_total", "counter",
         "Speculative decoding (DSpark): drafts verified and drafts accepted (output tokens that needed no pass of "
         "their own).");
  sample(out, "cedar_speculative_tokens_total", "kind=\"drafted\"", static_cast<double>(engine.drafted_tokens));
  sample(out, "cedar_speculative_tokens_total", "kind=\"accepted\"", static_cast<double>(engine.accepted_tokens));
  metric(out, "cedar_speculative_verify_passes_total", "counter", "Speculative verify passes (DSpark).");
  sample(out, "cedar_speculative_verify_passes_total", "", static_cast<double>(engine.verify_passes));
  metric(out, "cedar_speculative_mean_accepted_length", "gauge",
         "Drafts accepted per verify pass, since start (0 before the first pass).");
  sample(out, "cedar_speculative_mean_accepted_length", "",
         engine.verify_passes ? static_cast<double>(engine.accepted_tokens) / static_cast<double>(engine.verify_passes)
                              : 0.0);
  metric(out, "cedar_constrained_tokens_total", "counter", "Tokens sampled under a grammar mask (constrained decoding).");
  sample(out, "cedar_constrained_tokens_total", "", static_cast<double>(engine.constrained_tokens));
  metric(out, "cedar_constraint_seconds_total", "counter",
         "Seconds constrained decoding added to the engine's steps: waiting for token masks not ready when the "
         "forward pass ended, masking the logits, advancing the grammar matchers.");
  sample(out, "cedar_constraint_seconds_total", "", engine.constraint_seconds);
  metric(out, "cedar_constraint_mask_seconds_total", "counter",
         "Seconds spent computing token masks, on a thread beside the forward pass (hidden unless the masks "
         "take longer than the forward pass).");
  sample(out, "cedar_constraint_mask_seconds_total", "", engine.constraint_mask_seconds);
  metric(out, "cedar_constraint_budget_resamples_total", "counter",
         "Constrained tokens sampled again from a narrower mask so that the output completes (closed JSON, "
         "closed tool calls) within max_tokens.");
  sample(out, "cedar_constraint_budget_resamples_total", "", static_cast<double>(engine.constraint_budget_resamples));
  metric(out, "cedar_constraint_parked_steps_total", "counter",
         "Steps a constrained sequence sat out because its token mask was not ready within the mask budget "
         "(the rest of the batch went on).");
  sample(out, "cedar_constraint_parked_steps_total", "", static_cast<double>(engine.constraint_parked_steps));
  metric(out, "cedar_decode_seconds_total", "counter", "Seconds of decode work (forward steps), since start.");
  sample(out, "cedar_decode_seconds_total", "", engine.decode_seconds);
  metric(out, "cedar_prefix_cache_lookups_total", "counter", "Prefix-cache lookups by result.");
  sample(out, "cedar_prefix_cache_lookups_total", "result=\"hit\"", static_cast<double>(engine.prefix_hits));
  sample(out, "cedar_prefix_cache_lookups_total", "result=\"miss\"", static_cast<double>(engine.prefix_misses));
  metric(out, "cedar_kv_bytes", "gauge", "Bytes of KV held: prefix cache in memory and on disk, running sequences.");
  sample(out, "cedar_kv_bytes", "tier=\"memory\"", static_cast<double>(engine.kv_bytes_memory));
  sample(out, "cedar_kv_bytes", "tier=\"disk\"", static_cast<double>(engine.kv_bytes_disk));
  sample(out, "cedar_kv_bytes", "tier=\"sequences\"", static_cast<double>(engine.sequence_bytes));
  render_prefix_levels(out, engine.prefix_levels);
  metric(out, "cedar_queue_depth", "gauge", "Requests waiting in the engine's queue.");
  sample(out, "cedar_queue_depth", "", engine.queue_depth);
  metric(out, "cedar_active_sequences", "gauge", "Sequences the engine is advancing now.");
  sample(out, "cedar_active_sequences", "", engine.active_sequences);
  return out;
}

}  // namespace cedar::serve
