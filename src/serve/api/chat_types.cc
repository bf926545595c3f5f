#include "serve/api/chat_types.h"

namespace cedar::serve {

std::optional<int> effort_from_word(const std::string& word) {
  // deepseek-recipe's conversion: every API's words fall onto its V4.1 levels low | high | xhigh | max,
  // which its encoder renders as 50 | 75 | 75 | 100 ("minimal" counts as low, "medium" as high).
  if (word == "minimal" || word == "low") return 50;
  if (word == "medium" || word == "high" || word == "xhigh") return 75;
  if (word == "max") return 100;
  return std::nullopt;
}

}  // namespace cedar::serve
