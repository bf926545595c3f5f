// A one-line progress bar on stderr (only when stderr is a terminal, so logs and tests stay clean).
#pragma once

#include <cstdint>
#include <string>

namespace cedar::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(uint64_t done, uint64_t total, const std::string& detail = "");
  void finish();

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  int last_permille_ = -1;
};

}  // namespace cedar::cli
