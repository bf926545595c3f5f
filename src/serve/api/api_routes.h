// The routes of `cedar serve` (ApiServer's RouteHandler, api_routes.cc): every endpoint, rate
// limits and streaming on the transport's handler threads, and the API-shaped replies to the
// transport's refusals. Included by api_server.cc and api_routes.cc alone.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_set>

#include "serve/api/api_error.h"
#include "serve/api/api_server.h"
#include "serve/api/chat_service.h"
#include "serve/api/metrics.h"
#include "serve/api/replay_store.h"
#include "serve/http/auth.h"
#include "serve/http/rate_limit.h"
#include "serve/http/route_handler.h"

namespace cedar::serve {

inline bool is_anthropic_path(std::string_view path) { return path.rfind("/v1/messages", 0) == 0; }

Endpoint endpoint_of_path(std::string_view path);
// The error body in the endpoint's format (Anthropic's or OpenAI's), with its status.
Reply error_reply(bool anthropic, const ApiError& error);

class ApiRoutes final : public RouteHandler {
 public:
  ApiRoutes(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, const ServerOptions& options)
      : engine_(engine),
        key_(options.api_key),
        key_slots_(options.max_concurrent_per_key),
        token_budget_(options.max_tokens_per_minute_per_key),
        replay_(options.replay_turns),
        service_(tokenizer, engine, replay_, options.service) {}

  // On a handler thread: the route of `req` (its endpoint's handler, or a 404).
  void handle(ClientChannel& conn, const HttpRequest& req) override;
  Reply refusal(const Refusal& refusal) override;
  // Cancels the generations in flight (they end at their engine's next step); handlers that submit
  // later cancel at once (track).
  void stopping() override;

  // The endpoints that generate.
  enum class Api { kChatCompletions, kCompletions, kResponses, kMessages };

 private:
  static Endpoint endpoint_of(Api api);

  Reply handle_generation(Api api, const HttpRequest& req, ClientChannel& conn, bool* streamed);
  Reply handle_count_tokens(const HttpRequest& req);
  // 429 for a key whose tokens per minute are spent (or 429 without Retry-After for a prompt over
  // the whole budget), in the endpoint's error format.
  Reply token_limit_reply(Api api, const TokenBudget::Decision& budget, size_t prompt_tokens, int64_t output_budget);
  void stream(Api api, const PreparedGeneration& prepared, runtime::GenerationStream& generation, bool include_usage,
              ClientChannel& conn);
  // The generations in flight, so that stopping() can end them; a handler registers its own.
  void track(const std::shared_ptr<runtime::GenerationStream>& stream, bool add);
  Reply fail(Endpoint endpoint, bool anthropic, const ApiError& error) {
    Reply r = error_reply(anthropic, error);
    if (error.kind == ErrorKind::kRateLimited)
      r.headers.emplace_back("Retry-After", std::to_string(service_.retry_after_seconds()));
    metrics_.count_response(endpoint, r.status);
    return r;
  }

  runtime::Engine& engine_;
  const ApiKeyCheck key_;  // whose key a request presents: its per-key bucket (the transport checked it)
  KeySlots key_slots_;
  TokenBudget token_budget_;
  ReplayStore replay_;
  ChatService service_;
  std::mutex live_mu_;
  std::unordered_set<std::shared_ptr<runtime::GenerationStream>> live_;  // generations in flight
  bool stopped_ = false;                                                 // under live_mu_
  ServerMetrics metrics_;
};

}  // namespace cedar::serve
