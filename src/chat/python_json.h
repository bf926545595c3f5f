// Python-compatible text forms of JSON values. The official DeepSeek encoder builds prompts with
// Python's json.dumps(value, ensure_ascii=False) and str.format(), so reproducing its prompts byte
// for byte needs the same separators, escapes, key order and float spelling.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace cedar::chat {

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in insertion order (use
// ordered_json), floats as Python's repr (1.0, 1e-05, 1e+16), NaN/Infinity spelled as Python does,
// control characters as \u00XX, non-ASCII kept as is.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// Python's repr() of a float (shortest round-trip digits).
std::string python_float_repr(double v);

// What Python's str.format("{}", value) prints for a JSON scalar: strings as is, None, True,
// False, ints, float repr. Containers are an InvalidArgument error naming `what` (Python would
// print its own repr, which cedar does not reproduce).
Result<std::string> python_str(const nlohmann::ordered_json& value, const std::string& what);

// Python truthiness of a JSON value: null, false, 0, 0.0, "", [] and {} are false.
bool python_truthy(const nlohmann::ordered_json& value);

}  // namespace cedar::chat
