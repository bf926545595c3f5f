// The JSON Schema half of check_constraint() (constraint_limits.h): limits, the keywords xgrammar
// 0.2.9 enforces, and schemas that accept no value.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "constrain/constraint_limits.h"
#include "core/status.h"

namespace cedar::constrain {

enum class SchemaUse {
  kResponse,        // a response format's schema (xgrammar's JSON grammar)
  kToolParameters,  // a tool's parameters in the DSML tool-call grammar (xgrammar's deepseek_v4_1_xml style)
};

// OK or InvalidArgument naming the limit or keyword, the JSON pointer of the subschema ("#/properties/x")
// and `where`.
Status check_json_schema(const nlohmann::json& schema, SchemaUse use, std::string_view where,
                         const ConstraintLimits& limits);

}  // namespace cedar::constrain
