# xgrammar's C++ core (the grammar engine of constrained decoding, src/constrain), built from its
# pinned PyPI sdist. The repository does not carry xgrammar's code: configure fetches the sdist into
# CEDAR_DEPS_CACHE (default third_party/, git-ignored), checks its sha256, unpacks it, and this file
# compiles only the core's sources (cpp/*.cc without the Python/TVM-FFI bindings; no cpptrace) into
# the static library cedar_xgrammar.
#
# Offline builds: put the sdist at ${CEDAR_DEPS_CACHE}/xgrammar-0.2.9.tar.gz (same sha256) first.
set(CEDAR_XGRAMMAR_VERSION 0.2.9)
set(CEDAR_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(CEDAR_XGRAMMAR_URL
  "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${CEDAR_XGRAMMAR_VERSION}.tar.gz")
set(CEDAR_DEPS_CACHE "${PROJECT_SOURCE_DIR}/third_party" CACHE PATH
  "Where pinned third-party sources (the xgrammar sdist) are downloaded and unpacked")

set(_xg_tarball "${CEDAR_DEPS_CACHE}/xgrammar-${CEDAR_XGRAMMAR_VERSION}.tar.gz")
set(_xg_root "${CEDAR_DEPS_CACHE}/xgrammar-${CEDAR_XGRAMMAR_VERSION}")
# The stamp names the local fixes too (below), so a tree unpacked before a fix is unpacked again.
set(_xg_stamp "${_xg_root}/.cedar-unpacked-${CEDAR_XGRAMMAR_SHA256}-fix1-fix2-fix3")

if(NOT EXISTS "${_xg_stamp}")
  file(MAKE_DIRECTORY "${CEDAR_DEPS_CACHE}")
  set(_xg_have_tarball FALSE)
  if(EXISTS "${_xg_tarball}")
    file(SHA256 "${_xg_tarball}" _xg_sum)
    if(_xg_sum STREQUAL CEDAR_XGRAMMAR_SHA256)
      set(_xg_have_tarball TRUE)
    else()
      message(STATUS "xgrammar: ${_xg_tarball} has sha256 ${_xg_sum}, not the pinned one; fetching again")
      file(REMOVE "${_xg_tarball}")
    endif()
  endif()
  if(NOT _xg_have_tarball)
    message(STATUS "xgrammar: downloading the pinned sdist ${CEDAR_XGRAMMAR_VERSION} from PyPI")
    file(DOWNLOAD "${CEDAR_XGRAMMAR_URL}" "${_xg_tarball}.part" STATUS _xg_status TLS_VERIFY ON)
    list(GET _xg_status 0 _xg_code)
    if(_xg_code EQUAL 0)
      file(SHA256 "${_xg_tarball}.part" _xg_sum)
    endif()
    if(NOT _xg_code EQUAL 0 OR NOT _xg_sum STREQUAL CEDAR_XGRAMMAR_SHA256)
      file(REMOVE "${_xg_tarball}.part")
      message(FATAL_ERROR
        "xgrammar ${CEDAR_XGRAMMAR_VERSION} (cedar's grammar engine for constrained decoding) is missing.\n"
        "Download failed (${_xg_status}) or the sha256 differs from ${CEDAR_XGRAMMAR_SHA256}.\n"
        "Fix: give this machine access to files.pythonhosted.org, or download\n"
        "  ${CEDAR_XGRAMMAR_URL}\n"
        "elsewhere, check its sha256, and put it at ${_xg_tarball}, then configure again.")
    endif()
    file(RENAME "${_xg_tarball}.part" "${_xg_tarball}")
  endif()
  file(REMOVE_RECURSE "${_xg_root}")
  file(ARCHIVE_EXTRACT INPUT "${_xg_tarball}" DESTINATION "${CEDAR_DEPS_CACHE}")
  if(NOT EXISTS "${_xg_root}/include/xgrammar/xgrammar.h")
    message(FATAL_ERROR "xgrammar: ${_xg_tarball} did not unpack into ${_xg_root}")
  endif()
  # Local fix 1: a JSON string with minLength/maxLength lets through raw control characters
  # (U+0000-U+001F other than \r and \n), which JSON forbids inside strings; 0.2.9's unbounded
  # strings exclude them already. Found by tests/serve/constrained/sample_test.py (a tab inside a
  # maxLength string); checked by tests/constrain's JsonSchemaWalks.
  set(_xg_conv "${_xg_root}/cpp/json_schema_converter.cc")
  file(READ "${_xg_conv}" _xg_text)
  set(_xg_from "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);")
  set(_xg_to "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}}, true);")
  string(FIND "${_xg_text}" "${_xg_from}" _xg_at)
  if(_xg_at EQUAL -1)
    message(FATAL_ERROR "xgrammar: the bounded-string character class to fix was not found in ${_xg_conv}")
  endif()
  string(REPLACE "${_xg_from}" "${_xg_to}" _xg_text "${_xg_text}")
  # Local fix 2: with JSONSchemaFormat.excludes (cedar's DSML tool calls keep "</｜DSML｜" out of
  # values) 0.2.9 drops minLength/maxLength, in the raw XML-style parameter values and in the JSON
  # strings nested in them: it keeps the exclusions, which a counted repetition of one character
  # class cannot express. Every exclude holds a non-ASCII codepoint ("｜"), and a string without
  # those codepoints holds no exclude: the bounded string becomes a counted repetition of a class
  # without them (so a length-bounded tool string cannot contain "｜"). Excludes without such a
  # codepoint keep 0.2.9's behaviour (lengths dropped, with its warning). Checked by
  # tests/constrain's DsmlToolStringLengths and tests/serve/constrained/sample_test.py.
  macro(_cedar_xg_replace from_var to_var)
    string(FIND "${_xg_text}" "${${from_var}}" _xg_at)
    if(_xg_at EQUAL -1)
      message(FATAL_ERROR "xgrammar: the text of a local fix was not found in ${_xg_conv}:\n${${from_var}}")
    endif()
    string(REPLACE "${${from_var}}" "${${to_var}}" _xg_text "${_xg_text}")
  endmacro()
  set(_xg_from [=[#include "support/logging.h"
]=])
  set(_xg_to [=[#include "support/logging.h"
#include "support/encoding.h"
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  set(_xg_from [=[int32_t JSONSchemaConverter::GenerateString(const StringSpec& spec, const std::string& rule_name) {
]=])
  set(_xg_to [=[// cedar local fix 2: the codepoints a length-bounded string leaves out so that it holds none of
// `excludes`: their non-ASCII codepoints; std::nullopt when an exclude has none.
static std::optional<std::vector<GrammarBuilder::CharacterClassElement>> CedarBoundedStringExclusions(
    const std::vector<std::string>& excludes
) {
  std::vector<GrammarBuilder::CharacterClassElement> left_out;
  for (const auto& excluded : excludes) {
    bool covered = false;
    for (TCodepoint codepoint : ParseUTF8(excluded.c_str())) {
      if (codepoint < 0x80) continue;
      left_out.push_back({codepoint, codepoint});
      covered = true;
    }
    if (!covered) return std::nullopt;
  }
  return left_out;
}

int32_t JSONSchemaConverter::GenerateString(const StringSpec& spec, const std::string& rule_name) {
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  set(_xg_from [=[    if (!excludes_.empty()) {
      WarnDroppedLengthConstraints(spec, rule_name);
    } else {
      int32_t character =
          builder_.AddCharacterClass({{0, 0x1f}, {'"', '"'}, {'\\', '\\'}}, true);
]=])
  set(_xg_to [=[    auto left_out = CedarBoundedStringExclusions(excludes_);
    if (!left_out.has_value()) {
      WarnDroppedLengthConstraints(spec, rule_name);
    } else {
      left_out->insert(left_out->end(), {{0, 0x1f}, {'"', '"'}, {'\\', '\\'}});
      int32_t character = builder_.AddCharacterClass(*left_out, true);
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  set(_xg_from [=[    if (bounded) {
      WarnDroppedLengthConstraints(spec, rule_name);
    }
    return RuleRef(kXMLString);
]=])
  set(_xg_to [=[    if (bounded) {
      auto string_excludes = excludes_;
      string_excludes.push_back(xml_wrapper_.parameter_suffix);
      auto left_out = CedarBoundedStringExclusions(string_excludes);
      if (left_out.has_value()) {
        int32_t character = builder_.AddCharacterClass(*left_out, true);
        return Repeat(rule_name + "_characters", character, spec.min_length, spec.max_length);
      }
      WarnDroppedLengthConstraints(spec, rule_name);
    }
    return RuleRef(kXMLString);
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  file(WRITE "${_xg_conv}" "${_xg_text}")
  # Fix 2, part two: the mask cost. xgrammar's fast path for counted repetitions of a character
  # class (compiled_grammar.cc, FindCountedRepetitionBodies) took neither a repetition that ends
  # its rule (the raw value's rule) nor one followed by a byte of its class (the '<' of the
  # closing marker): the matcher then replayed every token at every step, ~4.6 ms of mask per
  # token for a maxLength 200 value. The raw value's repetition now goes inline before the marker
  # (deepseek.cc), and a follow byte inside the class leaves only the tokens holding it, at a
  # codepoint's start, to the replay (146 us per token; docs/SERVER.md, "Constraint limits").
  set(_xg_conv "${_xg_root}/cpp/converter_ext/deepseek.cc")
  file(READ "${_xg_conv}" _xg_text)
  set(_xg_from [=[  auto wrap = [&](int32_t value_expr, bool is_string) {
]=])
  set(_xg_to [=[  auto wrap = [&](int32_t value_expr, bool is_string) {
    // cedar local fix 2: a length-bounded raw string's counted repetition goes inline, right
    // before the closing marker, so that xgrammar's counted-repetition fast path takes it.
    if (is_string) {
      const auto ref = builder_.GetGrammarExpr(value_expr);
      if (ref.type == GrammarBuilder::GrammarExprType::kRuleRef) {
        const int32_t body = builder_.GetRule(ref[0]).body_expr_id;
        if (builder_.GetGrammarExpr(body).type == GrammarBuilder::GrammarExprType::kRepeat) value_expr = body;
      }
    }
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  file(WRITE "${_xg_conv}" "${_xg_text}")
  set(_xg_conv "${_xg_root}/cpp/compiled_grammar.cc")
  file(READ "${_xg_conv}" _xg_text)
  set(_xg_from [=[  int32_t max_upper = 0;
};
]=])
  set(_xg_to [=[  int32_t max_upper = 0;
  // cedar local fix 2: follow bytes that also start a codepoint of the class.
  ByteSet overlap;
};
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  set(_xg_from [=[        if ((bytes & *first_bytes[body_rule_id]).any()) {
          disqualified[body_rule_id] = true;
        }
]=])
  set(_xg_to [=[        // cedar local fix 2: such bytes leave the tokens holding them to the matcher's replay
        // (ClassifyRepetitionToken) instead of disqualifying the repetition.
        follow_bytes[body_rule_id].overlap |= bytes & *first_bytes[body_rule_id];
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  set(_xg_from [=[    const int next_state = NextStateOnByte(fsm.GetFsm(), state, byte);
]=])
  set(_xg_to [=[    if (state == fsm.GetStart() && follow_bytes.overlap[byte]) {
      // cedar local fix 2: the repetition could end before this byte as well as take it.
      return {RepetitionTokenClass::kUndecided};
    }
    const int next_state = NextStateOnByte(fsm.GetFsm(), state, byte);
]=])
  _cedar_xg_replace(_xg_from _xg_to)
  file(WRITE "${_xg_conv}" "${_xg_text}")
  # Local fix 3: the `date` and `date-time` formats took any day 01-31 in any month and the year
  # 0000 (2023-02-29, 2023-04-31), which RFC 3339's full-date does not (the day must exist in its
  # month; JSON Schema validators check it). The date now follows the calendar: 30-day months,
  # February with 29 days only in leap years (divisible by 4, centuries only by 400), years
  # 0001-9999. Found by tests/serve/constrained/sample_test.py (jsonschema's format checker);
  # checked by tests/constrain's DateFormatsFollowTheCalendar.
  set(_xg_conv "${_xg_root}/cpp/json_schema_converter.cc")
  file(READ "${_xg_conv}" _xg_text)
  set(_xg_from [=[(\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[1-2]\\d|3[01]))]=])
  set(_xg_to [=[((\\d{3}[1-9]|\\d{2}[1-9]\\d|\\d[1-9]\\d{2}|[1-9]\\d{3})-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))|(\\d\\d(0[48]|[2468][048]|[13579][26])|([13579][26]|[2468][048]|0[48])00)-02-29)]=])
  _cedar_xg_replace(_xg_from _xg_to)
  file(WRITE "${_xg_conv}" "${_xg_text}")
  file(TOUCH "${_xg_stamp}")
endif()

# The core only: every cpp/**/*.cc except the TVM-FFI / nanobind bindings of the Python package.
file(GLOB_RECURSE _xg_sources "${_xg_root}/cpp/*.cc")
list(FILTER _xg_sources EXCLUDE REGEX "/cpp/(tvm_ffi|nanobind)/")
add_library(cedar_xgrammar STATIC ${_xg_sources})
target_compile_features(cedar_xgrammar PUBLIC cxx_std_17)
target_include_directories(cedar_xgrammar SYSTEM PUBLIC
  "${_xg_root}/include" "${_xg_root}/3rdparty/dlpack/include" "${_xg_root}/3rdparty/picojson")
target_compile_definitions(cedar_xgrammar PUBLIC
  XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Third-party code: its own warnings are not cedar's to fix.
target_compile_options(cedar_xgrammar PRIVATE -w)
set_target_properties(cedar_xgrammar PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(cedar_xgrammar PUBLIC Threads::Threads)
