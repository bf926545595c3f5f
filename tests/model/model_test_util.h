// Shared helpers for the model tests.
#pragma once

#include <string>

#include "spec/config.h"

namespace cedar::model::testing {

inline std::string source_path(const std::string& rel) { return std::string(CEDAR_SOURCE_DIR) + "/" + rel; }

inline ModelConfig released_v41() {
  auto c = load_config(source_path("configs/deepseek-v4.1-flash.json"));
  if (!c.ok()) throw std::runtime_error(c.status().to_string());
  return *c;
}

}  // namespace cedar::model::testing
