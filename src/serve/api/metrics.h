// ServerMetrics: counters of the HTTP layer (lock-free atomics) and the Prometheus text of
// GET /metrics, which joins them with the engine's own statistics (runtime::EngineStats).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "runtime/engine.h"
#include "serve/api/chat_types.h"

namespace cedar::serve {

enum class Endpoint { kChatCompletions, kCompletions, kResponses, kMessages, kModels, kHealth, kMetrics, kOther };
inline constexpr size_t kEndpointCount = 8;
const char* endpoint_name(Endpoint e);

class ServerMetrics {
 public:
  void count_response(Endpoint endpoint, int http_status);
  // A finished generation: tokens as the client was billed, and whether the stream was cut short
  // by the client going away.
  void count_turn(const Usage& usage, bool client_gone);
  std::string render(const runtime::EngineStats& engine) const;

 private:
  // Status classes kept apart: the codes a client can cause or see.
  static constexpr std::array<int, 9> kCodes = {200, 400, 401, 404, 413, 429, 500, 503, 0};  // 0 = other
  static size_t code_slot(int http_status);
  std::array<std::array<std::atomic<uint64_t>, kCodes.size()>, kEndpointCount> responses_{};
  std::atomic<uint64_t> turns_{0}, prompt_tokens_{0}, completion_tokens_{0}, cached_tokens_{0},
      reasoning_tokens_{0}, client_disconnects_{0};
};

}  // namespace cedar::serve
