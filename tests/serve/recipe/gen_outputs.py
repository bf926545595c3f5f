#!/usr/bin/env python3
"""Writes outputs.jsonl: scripted completions (what the model "generates") on which cedar's output
assembly (responses and stream events of the three chat APIs) is checked against DeepSeek's
protocol library, deepseek-recipe 0.2.0 (check_outputs.py).

Deterministic (a fixed seed, no clock, no network): rerunning it rewrites the same file. Each line
is {"name", "completion", "thinking": bool, "tools": bool, "stop": [str] | null,
"max_tokens": int | null} and, for some, "plain": [[start, end], ...] and "format": the completion text after
the generation header (EOS included when the model ended the turn), whether the request is in
thinking mode and declares tools, its stop strings and its output budget (in tokens of the
byte-level test tokenizer: one per byte, one per control marker), and the code point ranges of
the completion written with ordinary tokens (one per byte) although they spell a control marker:
a model can write a marker's characters without its token, and both sides must read that as text.
"format" is the request's response format ("json_object", "json_schema" or "regex"; Chat
Completions and Responses only, regex Chat only): under json_object both sides read the answer as
JSON output (deepseek-recipe's parse_json_output), the other two leave it alone.

The completions cover plain answers, reasoning + answer, DSML tool calls (single and parallel,
string and JSON parameters, nested values, escapes), malformed tool arguments (non-JSON values of
string="false" parameters), DSML written when no tools were declared, truncation by max_tokens in
each part of the output, stop strings, and output that breaks the format (markers in the wrong
place, malformed DSML), each marker once as its token and once spelled with ordinary tokens,
and answers under a json_object response format (bare and fenced JSON, text before and after it,
leading newlines, stop strings inside and outside the JSON, truncation inside the JSON and inside
a fence, reasoning and tool calls around it) and, for contrast, the same kind of answers under
json_schema and regex formats.

    python3 tests/serve/recipe/gen_outputs.py            # from the repository root
"""

import json
import os
import random

EOS = "<｜end▁of▁sentence｜>"
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
         "matches in Paris Tokyo Zürich 東京 naïve café 42 3.14 -7 def main(): return x**2").split()
ASCII_WORDS = [w for w in WORDS if w.isascii()]


def invoke(name, params):
    """One DSML invoke; params are (name, value, is_string)."""
    out = "<｜DSML｜ invoke name=\"%s\">\n" % name
    for pname, value, is_string in params:
        out += "<｜DSML｜ parameter name=\"%s\" string=\"%s\">%s</｜DSML｜ parameter>\n" % (
            pname, "true" if is_string else "false", value)
    return out + "</｜DSML｜ invoke>\n"


def calls(*invokes):
    """A DSML calls block as V4.1 writes it: after a blank line, even when no content precedes it."""
    return "\n\n<｜DSML｜ calls>\n" + "".join(invokes) + "</｜DSML｜ calls>"


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def words(self, lo=2, hi=10, ascii_only=False):
        pool = ASCII_WORDS if ascii_only else WORDS
        return " ".join(self.r.choice(pool) for _ in range(self.r.randint(lo, hi)))

    def params(self):
        """Tool parameters: string and JSON values, as a model writes them."""
        choices = [
            ("city", self.r.choice(["Paris", "Zürich", "東京", "New York"]), True),
            ("days", str(self.r.randint(1, 14)), False),
            ("query", self.words(1, 5), True),
            ("verbose", self.r.choice(["true", "false"]), False),
            ("filters", json.dumps({"lang": "en", "max": self.r.randint(1, 9)}), False),
            ("tags", json.dumps(["a", "b", self.r.choice(WORDS)], ensure_ascii=False), False),
            ("ratio", self.r.choice(["0.5", "-3", "1e3"]), False),
            ("note", self.r.choice(['say "hi"', "back\\slash", "line\nbreak", "tab\there", "{not json}"]), True),
            ("empty", "", True),
        ]
        picked = self.r.sample(choices, self.r.randint(1, 4))
        return picked


def cases():
    g = Gen(20261203)
    out = []

    def add(name, completion, thinking=False, tools=False, stop=None, max_tokens=None):
        out.append({"name": name, "completion": completion, "thinking": thinking, "tools": tools,
                    "stop": stop, "max_tokens": max_tokens})

    # Plain answers (chat mode), with and without tools declared.
    for i in range(6):
        add("plain_%d" % i, g.words(1, 20) + EOS, tools=i % 2 == 1)
    add("plain_multiline", "Line one.\n\n- item\n- item 2\n\n```py\nprint(1)\n```" + EOS)
    add("plain_empty", EOS)
    add("plain_markup_lookalike", "a < b and <｜not a marker｜> or </tag>" + EOS, tools=True)

    # Reasoning + answer (thinking mode).
    for i in range(6):
        add("think_%d" % i, g.words(3, 15) + "</think>" + g.words(1, 15) + EOS, thinking=True, tools=i % 3 == 0)
    add("think_empty_reasoning", "</think>Just the answer." + EOS, thinking=True)
    add("think_empty_answer", "Only thoughts.</think>" + EOS, thinking=True)
    add("think_multiline", "Step 1.\nStep 2.\n\n</think>\n\nDone:\n1. a\n2. b" + EOS, thinking=True)

    # Tool calls: single, parallel, after content, after reasoning.
    for i in range(6):
        add("call_%d" % i, calls(invoke(g.r.choice(["get_weather", "search_docs", "run_sql"]), g.params())) + EOS,
            tools=True)
    for i in range(5):
        n = 2 + i % 3
        add("parallel_%d" % i, calls(*[invoke("tool_%d" % k, g.params()) for k in range(n)]) + EOS, tools=True)
    for i in range(4):
        add("content_then_call_%d" % i, g.words(2, 8) + calls(invoke("get_weather", g.params())) + EOS,
            tools=True)
    for i in range(4):
        add("think_then_call_%d" % i,
            g.words(2, 8) + "</think>" + ("" if i % 2 else g.words(1, 5)) +
            calls(*[invoke("search_docs", g.params()) for _ in range(1 + i % 2)]) + EOS,
            thinking=True, tools=True)
    add("call_no_params", calls(invoke("now", [])) + EOS, tools=True)

    # Malformed tool arguments: string="false" values that are not JSON.
    malformed = ["3 days", "{bad", "[1, 2", "tru", "", "'single'", "1 2 3", "{\"a\": }", "NaN", "Paris"]
    for i, value in enumerate(malformed):
        params = [("city", "Paris", True), ("days", value, False)] if i % 2 == 0 else [("days", value, False)]
        add("malformed_%d" % i, calls(invoke("get_weather", params)) + EOS, tools=True)
    add("malformed_parallel", calls(invoke("a", [("x", "1", False)]), invoke("b", [("y", "oops", False)])) + EOS,
        tools=True)
    add("malformed_after_reasoning", "Think.</think>" + calls(invoke("get_weather", [("days", "two", False)])) + EOS,
        thinking=True, tools=True)

    # DSML written although the request declared no tools: plain content on both sides.
    add("dsml_without_tools", "Sure." + calls(invoke("get_weather", [("city", "Paris", True)])) + EOS)
    add("dsml_without_tools_thinking", "Hm.</think>" + calls(invoke("x", [("a", "1", False)])) + EOS, thinking=True)

    # Truncation by max_tokens (one token per byte / marker): in the answer, the reasoning, a call.
    for i in range(4):
        text = g.words(8, 20, ascii_only=True)
        add("cut_content_%d" % i, text + EOS, max_tokens=len(text) // 2 + i, tools=i % 2 == 1)
    add("cut_reasoning", "A long chain of thought that goes on.</think>Answer." + EOS, thinking=True, max_tokens=12)
    add("cut_at_think_end", "Thought.</think>Answer." + EOS, thinking=True, max_tokens=9)
    call_text = "Calling." + calls(invoke("get_weather", [("city", "Paris", True), ("days", "3", False)])) + EOS
    for cut in (12, 20, 40):
        add("cut_in_call_%d" % cut, call_text, tools=True, max_tokens=cut)
    two_calls = calls(invoke("a", [("x", "1", False)]), invoke("b", [("y", "two", True)])) + EOS
    add("cut_after_first_call", two_calls, tools=True, max_tokens=two_calls.index("<｜DSML｜ invoke name=\"b\"") - 10)

    # Stop strings (on the answer).
    for i in range(4):
        words = g.words(6, 12, ascii_only=True).split()
        stop = words[len(words) // 2]
        add("stop_%d" % i, " ".join(words) + EOS, stop=[stop], tools=i % 2 == 1)
    add("stop_unmatched", "nothing to see" + EOS, stop=["zzz"])
    add("stop_two", "alpha beta gamma delta" + EOS, stop=["delta", "beta"])
    add("stop_in_reasoning_only", "stop here</think>fine answer" + EOS, thinking=True, stop=["stop"])
    add("stop_before_call", "Wait STOP now" + calls(invoke("a", [("x", "1", False)])) + EOS, tools=True,
        stop=["STOP"])
    add("stop_unicode", "café ☕ naïve" + EOS, stop=["☕"])

    # Output that breaks the format: deepseek-recipe's stream processor reads it without an error.
    def add_broken(name, parts, **kw):
        """`parts`: text, or ("plain", text) for text written with ordinary tokens."""
        text, plain = "", []
        for part in parts:
            if isinstance(part, tuple):
                plain.append([len(text), len(text) + len(part[1])])
                text += part[1]
            else:
                text += part
        add(name, text + EOS, **kw)
        if plain:
            out[-1]["plain"] = plain

    # Stop strings are matched in the answer before the DSML opening, and only against text of
    # ordinary tokens: a stop on the blank line before a calls block wins over the block, and a stop
    # that spells a special token matches it only when ordinary tokens write it.
    add_broken("stop_blank_line_before_calls", ["Hi" + calls(invoke("a", [("x", "1", False)]))], tools=True,
               stop=["\n\n"])
    add_broken("stop_spells_special_token", ["A<｜User｜>B"], stop=["<｜User｜>"])
    add_broken("stop_spells_special_token_spelled", ["A", ("plain", "<｜User｜>"), "B"], stop=["<｜User｜>"])

    block = "<｜DSML｜ calls>\n" + invoke("get_weather", [("city", "Paris", True), ("days", "3", False)]) + \
        "</｜DSML｜ calls>"
    one_call = invoke("a", [("x", "1", False)])
    for spelled in (False, True):
        # spelled: the marker that makes the case is written with ordinary tokens.
        s = "_spelled" if spelled else ""
        mark = (lambda t: ("plain", t)) if spelled else (lambda t: t)
        add_broken("broken_calls_after_text" + s, ["Let me check.", mark("<｜DSML｜"), block[len("<｜DSML｜"):]],
                   tools=True)
        add_broken("broken_calls_after_newline" + s, ["Checking:\n", mark("<｜DSML｜"), block[len("<｜DSML｜"):]],
                   tools=True)
        add_broken("broken_invoke_without_calls" + s, ["Sure ", mark("<｜DSML｜"), one_call[len("<｜DSML｜"):],
                                                       "and more text"], tools=True)
        add_broken("broken_stray_dsml" + s, ["a ", mark("｜DSML｜"), " b"], tools=True)
        add_broken("broken_stray_calls_end" + s, ["done ", mark("</｜DSML｜ calls>"), " really"], tools=True)
        add_broken("broken_stray_think_start" + s, ["x ", mark("<think>"), " y"], tools=True)
        add_broken("broken_stray_bos" + s, ["x ", mark("<｜begin▁of▁sentence｜>"), " y"])
        add_broken("broken_stray_think_end" + s, ["before", mark("</think>"), "\n\nafter"], tools=True)
        add_broken("broken_think_end_twice" + s, ["r</think>a", mark("</think>"), "b"], thinking=True)
        add_broken("broken_unknown_tag" + s, ["hi", mark("<｜DSML｜"), " foo>\nthe rest\n", mark("<｜DSML｜"),
                                              " bar>"], tools=True)
        add_broken("broken_unknown_tag_then_invoke" + s, ["hi\n\n", mark("<｜DSML｜"), " foo>\n", one_call,
                                                          "tail"], tools=True)
        add_broken("broken_calls_in_reasoning" + s, ["plan", mark("<｜DSML｜"), block[len("<｜DSML｜"):]],
                   thinking=True, tools=True)
        add_broken("broken_spelled_eos" + s, ["early ", mark("<｜end▁of▁sentence｜>"), " late"], tools=True)
        add_broken("broken_dsml_without_tools" + s, ["Sure.", mark("<｜DSML｜"), block[len("<｜DSML｜"):]])
    # Malformed DSML inside the block (markers as tokens): what recipe's rules make of it.
    head = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
    add_broken("broken_missing_think_end", ["no end marker"], thinking=True, tools=True)
    add_broken("broken_duplicate_param", [head + "<｜DSML｜ parameter name=\"city\" string=\"true\">a</｜DSML｜ parameter>\n"
                                          "<｜DSML｜ parameter name=\"city\" string=\"true\">b</｜DSML｜ parameter>\n"
                                          "</｜DSML｜ invoke>\n</｜DSML｜ calls>"], tools=True)
    add_broken("broken_text_after_calls", [calls(one_call), "trailing words"], tools=True)
    add_broken("broken_string_attribute", [head + "<｜DSML｜ parameter name=\"city\" string=\"maybe\">Paris</｜DSML｜ "
                                           "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"], tools=True)
    add_broken("broken_invoke_without_name", ["\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nme=\"x\">\n</｜DSML｜ invoke>\n"
                                              "</｜DSML｜ calls>"], tools=True)
    add_broken("broken_unclosed_invoke", [head + "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris"],
               tools=True)
    add_broken("broken_v4_spelling", ["\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter "
                                      "name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                                      "</｜DSML｜tool_calls>"], tools=True)
    add_broken("broken_value_spells_close", [head + "<｜DSML｜ parameter name=\"city\" string=\"true\">a",
                                             ("plain", "</｜DSML｜ parameter>"), "b</｜DSML｜ parameter>\n"
                                             "</｜DSML｜ invoke>\n</｜DSML｜ calls>"], tools=True)

    # JSON output (response_format / text.format json_object). The one-byte tokens of the test
    # tokenizer make every character of the text around the JSON a piece of its own: one space each.
    # The names hold "json", which a json_object request must mention.
    def add_json(name, completion, fmt="json_object", **kw):
        add(name, completion + EOS, **kw)
        out[-1]["format"] = fmt

    obj = '{"name": "Ada", "langs": ["en", "fr"], "age": 36, "note": "a `tick` and {braces}"}'
    add_json("json_bare_object", obj)
    add_json("json_bare_array", '[1, 2.5, {"k": "v"}, [], "東京"]')
    add_json("json_fenced", "```json\n" + obj + "\n```")
    add_json("json_fenced_plain", "```\n" + obj + "\n```")
    add_json("json_prose_around_fence", "Here is the JSON you asked for:\n\n```json\n" + obj +
             "\n```\n\nLet me know if you need more. 🙂")
    add_json("json_bare_after_prose", "Sure! The answer is " + obj + " Hope this helps.")
    add_json("json_leading_newlines", "\n\n" + obj)
    add_json("json_leading_newlines_spaces", "\n\n  \n" + obj)
    add_json("json_leading_newlines_fence", "\n\n```json\n" + obj + "\n```\n")
    add_json("json_fence_without_newline", "```json" + obj + "```")
    add_json("json_other_fence", "```python\nprint([1, 2])\n```")
    add_json("json_fenced_twice", "```json\n[1]\n```\nand\n```json\n[2]\n```")
    add_json("json_none", "I cannot answer that in JSON, sorry.")
    add_json("json_empty", "")
    add_json("json_unicode_prose", "Voilà — 東京: " + obj)
    add_json("json_stray_think_end", "x</think>y" + obj + "\n```</think>z")
    add_json("json_spelled_think_end", "x<think>y</think>" + obj)
    add_json("json_fence_close_in_string", '```json\n{"code": "a\n```\nb"}\n```')
    # Stop strings are matched inside the JSON only (Chat Completions: Responses has none).
    add_json("json_stop_inside", obj, stop=["Ada"])
    add_json("json_stop_inside_fenced", "Okay:\n```json\n" + obj + "\n```", stop=["langs"])
    add_json("json_stop_outside", "Stop here. ```json\n" + obj + "\n```\nStop there.", stop=["Stop"])
    add_json("json_stop_is_fence", "```json\n" + obj + "\n```\n", stop=["```"])
    # Truncation by max_tokens: inside the JSON, inside a possible closing fence, in the prose before
    # an opening fence and inside it.
    fenced = "Result:\n```json\n" + obj + "\n```\nDone."
    add_json("json_cut_in_bare", obj, max_tokens=20)
    add_json("json_cut_in_fenced", fenced, max_tokens=fenced.index('"age"'))
    add_json("json_cut_in_closing_fence", fenced, max_tokens=fenced.index("\n```\nDone") + 2)
    add_json("json_cut_in_opening_fence", fenced, max_tokens=fenced.index("```json") + 2)
    add_json("json_cut_in_prose", fenced, max_tokens=4)
    # Reasoning, and tool calls before the JSON or after its closing fence (inside bare JSON, DSML is
    # JSON text).
    add_json("json_thinking", "The user wants json.\n\n</think>\n\nSure:\n```json\n" + obj + "\n```", thinking=True)
    add_json("json_thinking_bare", "Plan: {\"x\": 1}</think>" + obj, thinking=True)
    add_json("json_calls_after_fence", "```json\n" + obj + "\n```" + calls(invoke("get_weather", [("city", "Paris", True)])),
             tools=True)
    add_json("json_calls_after_bare", obj + calls(invoke("get_weather", [("city", "Paris", True)])), tools=True)
    add_json("json_calls_without_json", "Checking the weather first." + calls(invoke("now", [])), tools=True)
    # json_schema and regex formats read the answer as usual: the text around the JSON stays.
    add_json("json_schema_prose_around", "Here:\n```json\n" + obj + "\n```\nBye.", fmt="json_schema")
    add_json("json_schema_stop_outside", "Stop. " + obj, fmt="json_schema", stop=["Stop"])
    add_json("regex_prose_around_json", "Here:\n```json\n[1]\n```", fmt="regex")
    # Continuations (Chat Completions `prefix: true` on a final assistant message; the other APIs
    # have none): in thinking mode the parser resumes inside the answer once the message has one,
    # else inside its reasoning; either keeps the newlines that begin the completion.
    def add_prefix(name, completion, content, reasoning=None, **kw):
        add(name, completion + EOS, **kw)
        out[-1]["prefix"] = {"content": content, "reasoning": reasoning}

    add_prefix("prefix_answer", "\n\n more of the answer", "Once upon", thinking=True)
    add_prefix("prefix_answer_after_reasoning", " a time.</think> and", "Once upon", "r", thinking=True)
    add_prefix("prefix_reasoning", "\nmore thought.\n\n</think>\n\nThe answer.", "", "I think", thinking=True)
    add_prefix("prefix_empty", "\n\nfresh thought</think>\n\nanswer", "", thinking=True)
    add_prefix("prefix_chat_mode", "\n\n continued", "Once upon")
    add_prefix("prefix_answer_stop", " then STOP here", "Once", thinking=True, stop=["STOP"])
    add_prefix("prefix_answer_cut", " a very long continuation", "Once", thinking=True, max_tokens=5)
    add_prefix("prefix_reasoning_cut", " still thinking and thinking</think>x", "", "Hmm", thinking=True,
               max_tokens=6)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "outputs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for case in cases():
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
    print("wrote %d completions to %s" % (len(cases()), path))


if __name__ == "__main__":
    main()
