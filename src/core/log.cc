#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace cedar {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("CEDAR_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }
void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < level_storage().load()) return;
  static std::mutex mu;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "cedar [%s] ", kNames[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

}  // namespace cedar
