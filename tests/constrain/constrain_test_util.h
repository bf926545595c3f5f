// What the constrain tests share: the V4.1 tokenizer the server uses (the repository's
// data/tokenizers/deepseek-v4 with the V4.1 markers), the model's logits width, and one grammar
// engine over them.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "constrain/grammar_engine.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace cedar::constrain::test_util {

inline const tokenizer::Tokenizer& tok() {
  static const std::unique_ptr<tokenizer::Tokenizer> t = [] {
    auto r = tokenizer::load_with_v41_markers(std::string(CEDAR_SOURCE_DIR) + "/data/tokenizers/deepseek-v4");
    if (!r.ok()) throw std::runtime_error(r.status().to_string());
    return std::move(*r);
  }();
  return *t;
}

// The model's logits are wider than the tokenizer's vocabulary (V4: 129,280 ids).
inline constexpr int kVocab = 129280;

// One engine with the default options, built on first use (building xgrammar's view of the
// vocabulary takes a while).
inline GrammarEngine& engine() {
  static const std::unique_ptr<GrammarEngine> e = [] {
    auto r = GrammarEngine::create(tok(), kVocab);
    if (!r.ok()) throw std::runtime_error(r.status().to_string());
    return std::move(*r);
  }();
  return *e;
}

}  // namespace cedar::constrain::test_util
