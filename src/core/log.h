// Minimal leveled logging to stderr. CEDAR_LOG_LEVEL=debug|info|warn|error sets the threshold.
#pragma once

namespace cedar {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace cedar

#define CEDAR_LOG_DEBUG(...) ::cedar::log_message(::cedar::LogLevel::kDebug, __VA_ARGS__)
#define CEDAR_LOG_INFO(...) ::cedar::log_message(::cedar::LogLevel::kInfo, __VA_ARGS__)
#define CEDAR_LOG_WARN(...) ::cedar::log_message(::cedar::LogLevel::kWarn, __VA_ARGS__)
#define CEDAR_LOG_ERROR(...) ::cedar::log_message(::cedar::LogLevel::kError, __VA_ARGS__)
