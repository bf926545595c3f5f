// CEDAR_CHECK: invariants that only a bug can break. Always on; prints file:line and aborts.
// CEDAR_DCHECK: the same, compiled out of release builds (for inner loops).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cedar::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace cedar::detail

#define CEDAR_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (__builtin_expect(!(cond), 0))                                                 \
      ::cedar::detail::check_failed(__FILE__, __LINE__, #cond, "" __VA_ARGS__);       \
  } while (0)

#ifdef NDEBUG
#define CEDAR_DCHECK(cond, ...) \
  do {                          \
  } while (0)
#else
#define CEDAR_DCHECK(cond, ...) CEDAR_CHECK(cond, __VA_ARGS__)
#endif
