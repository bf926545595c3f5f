#include "core/check.h"

#include <cstdarg>

namespace cedar::detail {

void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "cedar: check failed at %s:%d: %s", file, line, cond);
  if (fmt && *fmt) {
    std::fputs(": ", stderr);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  std::fputc('\n', stderr);
  std::abort();
}

}  // namespace cedar::detail
