#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace cedar::cli {

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), enabled_(isatty(STDERR_FILENO)) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done, uint64_t total, const std::string& detail) {
  if (!enabled_ || total == 0) return;
  const int permille = static_cast<int>(done * 1000 / total);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %s\033[K", label_.c_str(), filled,
               "##############################", kWidth - filled, "", permille / 10.0, detail.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace cedar::cli
