// The script file of `cedar serve --scripted FILE`: which completions the ScriptedEngine plays.
//
//   {
//     "token_delay_ms": 5,                  // optional, per generated token
//     "prefill_delay_us_per_token": 0,      // optional, per uncached prompt token
//     "max_active": 0,                      // optional, concurrent requests (0 = no limit)
//     "replies": [                          // the first whose condition matches is played
//       {"when_prompt_contains": "<tool_result>", "completion": "It is sunny.<｜end▁of▁sentence｜>"},
//       {"completion": "\n\n<｜DSML｜ calls>\n...</｜DSML｜ calls><｜end▁of▁sentence｜>"},
//       {"completion_ids": [19923, 1]}      // exact ids instead of text
//     ]
//   }
//
// Completion texts are encoded with the served tokenizer (special tokens written in the text, like
// the EOS marker, become their ids), so the output decodes back to exactly that text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/scripted_engine.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

// The scripted engine is a runtime::Engine; the serving code and its tests name it from here.
using runtime::scripted_alternative;
using runtime::scripted_logprob;
using runtime::ScriptedEngine;
using runtime::ScriptedEngineOptions;
using runtime::ScriptedReply;

struct ScriptFile {
  std::vector<ScriptedReply> replies;
  ScriptedEngineOptions options;
};

// Errors (InvalidArgument / NotFound / DataLoss) name `source` and the offending field.
Result<ScriptFile> parse_script(std::string_view json_text, const tokenizer::Tokenizer& tok,
                                const std::string& source);
Result<ScriptFile> load_script(const std::string& path, const tokenizer::Tokenizer& tok);

}  // namespace cedar::serve
