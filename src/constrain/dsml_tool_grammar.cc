// The structural tag of DeepSeek-V4.1's DSML tool calls (grammar_engine.h), written as xgrammar's
// own builtin "deepseek_v4_1" structural tag writes it (python/xgrammar/builtin_structural_tag.py of
// the pinned sdist), minus its reasoning prefix: cedar gates the reasoning itself (GrammarConstraint).
// The markers are the ones chat/completion_parser reads back.
#include <nlohmann/json.hpp>

#include "constrain/grammar_engine.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::constrain {
namespace {

using json = nlohmann::json;

// The blank line belongs to the block's start, as the chat template writes "\n\n<｜DSML｜ calls>".
// cedar's parser (chat/completion_parser, deepseek-recipe's rules) would also read the block
// without it, dropping the newlines before the marker; the grammar keeps the template's spelling.
constexpr const char* kCallsBeginAfterText = "\n\n<｜DSML｜ calls>\n";
constexpr const char* kCallsEnd = "</｜DSML｜ calls>";
constexpr const char* kInvokeBeginPrefix = "<｜DSML｜ invoke name=\"";
constexpr const char* kInvokeBeginSuffix = "\">\n";
constexpr const char* kInvokeEnd = "</｜DSML｜ invoke>\n";
constexpr const char* kValueEnd = "</｜DSML｜";

}  // namespace

Result<std::string> dsml_tool_call_structural_tag(const std::string& tools_json, bool required, int max_whitespace_run) {
  const json tools = json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty())
    return invalid_argument("tool-call constraint: the tools must be a non-empty JSON array");
  json invokes = json::array();
  for (const json& tool : tools) {
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
      return invalid_argument("tool-call constraint: every tool needs a name");
    // No parameters: any arguments (xgrammar's `true` schema), as its builtin tag does.
    const auto params = tool.find("parameters");
    const json schema = params == tool.end() || params->is_null() ? json(true) : *params;
    invokes.push_back({{"type", "tag"},
                       {"begin", kInvokeBeginPrefix + tool["name"].get<std::string>() + kInvokeBeginSuffix},
                       {"content",
                        {{"type", "json_schema"},
                         {"json_schema", schema},
                         {"style", "deepseek_v4_1_xml"},
                         {"max_whitespace_cnt", max_whitespace_run},
                         // The parser ends a value at "</" + the marker whatever follows, so a value
                         // may not hold it: after it only the parameter's own " parameter>" fits.
                         {"excludes", {kValueEnd}}}},
                       {"end", kInvokeEnd}});
  }
  const json calls = {{"type", "tags_with_separator"},
                      {"tags", invokes},
                      {"separator", ""},
                      {"at_least_one", true},
                      {"stop_after_first", false}};
  json format;
  if (required) {
    // The prompt already holds "\n\n<｜DSML｜ calls>\n" (deepseek-recipe's prefill for a forced call).
    format = {{"type", "sequence"}, {"elements", {calls, {{"type", "const_string"}, {"value", kCallsEnd}}}}};
  } else {
    // Free text, then at most one calls block, which ends the turn. The free text never holds the
    // DSML marker: the parser opens the calls on its token wherever it stands, and xgrammar's
    // builtin tag (a triggered tag on "<｜DSML｜ calls>", the marker allowed in text) would let a
    // stray one through. A triggered tag cannot exclude it (excluding the marker kills the trigger
    // that contains it), so the free text is its own element and the block, blank line included,
    // may follow it. The other control markers (<think>, </think>, BOS, EOS) are kept out of the
    // free text too: their tokens never pass a grammar, and the parser would read a spelling of
    // one by ordinary tokens as text, which a constrained answer has no use for.
    const json block = {{"type", "tag"}, {"begin", kCallsBeginAfterText}, {"content", calls}, {"end", kCallsEnd}};
    const json excludes = {tokenizer::kThinkStart, tokenizer::kThinkEnd, tokenizer::kBos, tokenizer::kEos,
                           tokenizer::kDsml};
    format = {{"type", "sequence"},
              {"elements",
               {{{"type", "any_text"}, {"excludes", excludes}}, {{"type", "optional"}, {"content", block}}}}};
  }
  return json{{"type", "structural_tag"}, {"format", format}}.dump();
}

}  // namespace cedar::constrain
