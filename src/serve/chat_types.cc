#include "serve/chat_types.h"

namespace cedar::serve {

std::optional<int> effort_from_word(const std::string& word) {
  // Relative to V4.1's default of 50, which OpenAI's and Anthropic's default ("medium") names.
  // V4.1's own encoder aliases differ (its "high" is 50, "xhigh" 75): clients speak the API's words.
  if (word == "minimal") return 1;
  if (word == "low") return 25;
  if (word == "medium") return 50;
  if (word == "high") return 75;
  if (word == "xhigh") return 90;
  if (word == "max") return 100;
  return std::nullopt;
}

}  // namespace cedar::serve
