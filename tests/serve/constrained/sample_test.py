#!/usr/bin/env python3
"""Constrained decoding on a random tiny checkpoint: every sampled output must parse and validate.

  sample_test.py PATH/TO/cedar WORK_DIR [--samples N] [--kinds k1,k2] [--report FILE]

`cedar serve -m TINY` (a `cedar make-tiny` checkpoint, random weights: its outputs are noise, so
only the constraint can make them well-formed) answers N requests per constraint kind, each sampled
at temperature 1 with its own seed, through all three APIs:

  json_object       Chat Completions, response_format json_object         -> json.loads
  json_schema       Chat Completions (streamed) and Responses, strict json_schema with nested
                    objects, arrays, enums and required properties         -> jsonschema
  regex             Chat Completions, response_format regex               -> re.fullmatch
  tool_required     Responses, tool_choice "required" over two tools      -> tool name declared,
                    arguments valid against that tool's schema (jsonschema)
  named_tool        Anthropic Messages, tool_choice {type: tool, name}    -> that tool, valid input
                    (its schema has string lengths, raw and nested in an array of objects)
  tool_auto         Chat Completions, tools with tool_choice auto         -> any call made is valid
  keywords          Chat Completions, a loose json_schema using every keyword cedar enforces (pattern,
                    format, lengths, multipleOf, prefixItems, a disjoint oneOf, anyOf, $ref recursion,
                    patternProperties, const, ...)                         -> jsonschema with formats

Before sampling, every schema keyword cedar does not enforce (not, allOf of two, an overlapping oneOf,
contains, if/then, dependentRequired, uniqueItems) and every schema that accepts nothing must get a
400 naming it, on all three APIs (jsonschema confirms each such schema does constrain a value).

The validator is the `jsonschema` package (Debian python3-jsonschema), independent of cedar. Every
sample must parse and validate, also those that max_tokens ended: near the end of the budget cedar
closes a constrained output (TokenConstraint::mask_to_finish_within), so a cut JSON value or tool
call is still complete. Random weights wander (json_object's any object or array into long strings
and deep nesting, the tool kinds into more calls, tool_auto into free text), so many samples reach
max_tokens; they are counted ("cut") beside those that ended by themselves ("ended"), with the
tokens the engine sampled again to close in time. Afterwards /metrics gives the per-token cost of
constrained decoding beside the decode time per token: what it adds to the engine's steps (waiting
for masks not ready when the forward pass ends, masking the logits, advancing the matchers) and
the masks' own computing time, which runs beside the forward pass. The same number of
unconstrained requests is the baseline. Exit 0 when every sample validates, 1 otherwise, 77 without jsonschema.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "py"))

try:
    import jsonschema
except ImportError:
    print("SKIP: the jsonschema package is missing (Debian: python3-jsonschema; scripts/deps.sh installs it)")
    sys.exit(77)

from restart_test import Server  # noqa: E402  (the serve-process helper of the restart test)

MODEL = "DeepSeek-V4.1-Flash"
USER = [{"role": "user", "content": "Reply in JSON, please."}]

# Strict form (every property required, no others), so the client's schema is what is validated.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "warn", "fail"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "ratio": {"type": "boolean"},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "level": {"type": "string", "enum": ["a", "b"]}},
            "required": ["name", "level"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y", "z"]}, "maxItems": 3},
    },
    "required": ["status", "count", "ratio", "owner", "tags"],
    "additionalProperties": False,
}

REGEX = r"(yes|no|maybe): [a-z]{1,6}( [a-z]{1,6}){0,2} [0-9]{1,3}\."

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 14},
                          "metric": {"type": "boolean"}},
           "required": ["city", "days"]}
# String lengths in tool parameters (a raw DSML value and a JSON string nested in one), which
# xgrammar 0.2.9 dropped there (local fix 2 in cmake/Xgrammar.cmake).
SEARCH = {"type": "object",
          "properties": {"topic": {"type": "string", "enum": ["news", "docs"]},
                         "query": {"type": "string", "minLength": 2, "maxLength": 6},
                         "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                         "filters": {"type": "array", "items": {"type": "string", "enum": ["en", "fr"]},
                                     "maxItems": 2},
                         "notes": {"type": "array", "maxItems": 2, "items": {
                             "type": "object", "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 4}},
                             "required": ["text"], "additionalProperties": False}}},
          "required": ["topic", "query"]}
TOOLS = {"get_weather": WEATHER, "search_docs": SEARCH}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": "a tool", "parameters": s}}
              for n, s in TOOLS.items()]
RESPONSES_TOOLS = [{"type": "function", "name": n, "description": "a tool", "parameters": s} for n, s in TOOLS.items()]
MESSAGES_TOOLS = [{"name": n, "description": "a tool", "input_schema": s} for n, s in TOOLS.items()]

MAX_TOKENS = 512

# Every keyword cedar enforces, loose (not strict): the sampled value must satisfy all of them.
KEYWORDS_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-f0-9]{4}$"},
        "day": {"type": "string", "format": "date"},
        "name": {"type": "string", "minLength": 2, "maxLength": 8},
        "step": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 50},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False,
                 "minItems": 2},
        "shape": {"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1}},
             "required": ["kind", "r"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "dot"}}, "required": ["kind"],
             "additionalProperties": False}]},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Maybe"},
        "tree": {"$ref": "#/$defs/node"},
        "labels": {"type": "object", "patternProperties": {"^l[0-9]$": {"type": "boolean"}},
                   "additionalProperties": False, "maxProperties": 2},
        "version": {"const": "v1", "type": "string"},
        "tags": {"type": ["array", "null"], "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["id", "day", "name", "step", "ratio", "pair", "shape", "maybe", "tree", "labels", "version", "tags"],
    "additionalProperties": False,
    "$defs": {"node": {"type": "object", "description": "a tree",
                       "properties": {"v": {"type": "integer"},
                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                       "required": ["v"], "additionalProperties": False}},
}

NOTHING = object()  # no value is accepted: nothing to show with jsonschema

# Keywords cedar cannot enforce, and schemas that accept nothing: each a 400 naming the reason. Each
# comes with a value that the schema's plain part accepts but the keyword refuses, so jsonschema
# shows the keyword does constrain.
REFUSED = [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["a"]}}, "'not'", {"a": 1}),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}, "'allOf'", {}),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf'", 3),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, "'contains'", [1]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "'if'", {"a": 1}),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, "'dependentRequired'", {"a": 1}),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'", [1, 1]),
    ({"type": "number", "multipleOf": 0.5}, "'multipleOf'", 0.3),
    ({"anyOf": [{"$ref": "#"}]}, "accepts no value", NOTHING),
    ({"type": []}, "accepts no value", NOTHING),
]


# The server's default mode is thinking (DeepSeek's); every kind but thinking_json_schema asks for
# chat mode (Chat Completions and Messages spell it alike; Responses says reasoning effort "none").
CHAT_MODE = {"type": "disabled"}


def validate(instance, schema):
    jsonschema.validate(instance, schema, cls=jsonschema.Draft202012Validator)


def sse_events(data):
    for block in data.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


# Each kind: (request builder, checker). A checker raises on an invalid output and returns the
# completion token count.
def json_object_request(seed):
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": MAX_TOKENS, "response_format": {"type": "json_object"},
                                    "thinking": CHAT_MODE}


# A checker returns (completion tokens, whether max_tokens ended the output).
def check_chat_json(status, data, schema=None):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']}"
    value = json.loads(choice["message"]["content"])
    if schema is not None:
        validate(value, schema)
    return body["usage"]["completion_tokens"], choice["finish_reason"] == "length"


def json_schema_request(seed):
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}
    if seed % 2:  # Responses
        return "/v1/responses", {"model": MODEL, "input": USER, "temperature": 1, "max_output_tokens": MAX_TOKENS,
                                 "text": {"format": fmt}, "reasoning": {"effort": "none"}, "seed": seed}
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": MAX_TOKENS, "stream": True, "thinking": CHAT_MODE,
                                    "stream_options": {"include_usage": True},
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}}


def check_json_schema(status, data):
    assert status == 200, f"status {status}: {data[:300]!r}"
    if data.startswith(b"data: "):  # the streamed Chat Completions case
        text, finish, tokens = "", None, 0
        for event in sse_events(data):
            for choice in event.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
        assert finish in ("stop", "length"), f"finish_reason {finish}"
        validate(json.loads(text), ANSWER_SCHEMA)
        return tokens, finish == "length"
    body = json.loads(data)
    cut = body["status"] == "incomplete" and body["incomplete_details"]["reason"] == "max_output_tokens"
    assert body["status"] == "completed" or cut, f"status {body['status']} {body.get('incomplete_details')}"
    texts = [c["text"] for item in body["output"] if item["type"] == "message" for c in item["content"]]
    validate(json.loads("".join(texts)), ANSWER_SCHEMA)
    return body["usage"]["output_tokens"], cut


def regex_request(seed):
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": MAX_TOKENS, "response_format": {"type": "regex", "regex": REGEX},
                                    "thinking": CHAT_MODE}


def check_regex(status, data):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']}"
    assert re.fullmatch(REGEX, choice["message"]["content"]), repr(choice["message"]["content"])
    return body["usage"]["completion_tokens"], choice["finish_reason"] == "length"


def tool_required_request(seed):
    return "/v1/responses", {"model": MODEL, "input": "Use a tool.", "tools": RESPONSES_TOOLS,
                             "tool_choice": "required", "temperature": 1, "seed": seed,
                             "max_output_tokens": MAX_TOKENS, "reasoning": {"effort": "none"}}


def check_tool_required(status, data):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    cut = body["status"] == "incomplete" and body["incomplete_details"]["reason"] == "max_output_tokens"
    assert body["status"] == "completed" or cut, f"status {body['status']} {body.get('incomplete_details')}"
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert calls, "no function call"
    for call in calls:
        assert call["name"] in TOOLS, call["name"]
        validate(json.loads(call["arguments"]), TOOLS[call["name"]])
    return body["usage"]["output_tokens"], cut


def named_tool_request(seed):
    return "/v1/messages", {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "Go."}],
                            "tools": MESSAGES_TOOLS, "tool_choice": {"type": "tool", "name": "search_docs"},
                            "temperature": 1, "metadata": {"user_id": str(seed)}, "seed": seed,
                            "thinking": CHAT_MODE}


def check_named_tool(status, data):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    assert body["stop_reason"] in ("tool_use", "max_tokens"), body["stop_reason"]
    uses = [block for block in body["content"] if block["type"] == "tool_use"]
    assert uses, "no tool_use block"
    for use in uses:
        assert use["name"] == "search_docs", use["name"]
        validate(use["input"], SEARCH)
    return body["usage"]["output_tokens"], body["stop_reason"] == "max_tokens"


def tool_auto_request(seed):
    # Free text may run to max_tokens (no grammar ends it), so this kind's budget is small.
    return "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
                                    "tools": CHAT_TOOLS, "temperature": 1, "seed": seed, "max_tokens": 128,
                                    "thinking": CHAT_MODE}


def check_tool_auto(status, data):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    choice = body["choices"][0]
    for call in choice["message"].get("tool_calls") or []:
        name = call["function"]["name"]
        assert name in TOOLS, name
        validate(json.loads(call["function"]["arguments"]), TOOLS[name])
    # Free text may run to max_tokens; a call, once made, was valid above.
    assert choice["finish_reason"] in ("stop", "tool_calls", "length"), choice["finish_reason"]
    return body["usage"]["completion_tokens"], choice["finish_reason"] == "length"


def thinking_json_schema_request(seed):
    # Thinking mode: the reasoning is free until `</think>` (which closing forces when the answer
    # would not fit otherwise); it can neither end the turn nor open tool calls.
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": 256, "reasoning_effort": "high",
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}}


def check_thinking_json_schema(status, data):
    tokens, cut = check_chat_json(status, data, ANSWER_SCHEMA)
    message = json.loads(data)["choices"][0]["message"]
    assert "reasoning_content" in message, "thinking mode gives reasoning_content"
    assert not message.get("tool_calls"), "no tools were declared"
    return tokens, cut


def keywords_request(seed):
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": MAX_TOKENS, "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "answer", "schema": KEYWORDS_SCHEMA}}}


def check_keywords(status, data):
    body = json.loads(data)
    assert status == 200, f"status {status}: {data[:300]!r}"
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']}"
    jsonschema.validate(json.loads(choice["message"]["content"]), KEYWORDS_SCHEMA, cls=jsonschema.Draft202012Validator,
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return body["usage"]["completion_tokens"], choice["finish_reason"] == "length"


def check_refused(server):
    """Each REFUSED schema: a 400 naming it on all three APIs. Returns the failures."""
    failures = []
    for schema, reason, value in REFUSED:
        if value is not NOTHING:  # (jsonschema would recurse without end on anyOf: [{"$ref": "#"}])
            try:
                jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
                failures.append(f"{reason}: jsonschema accepts {value!r}, so the case shows nothing")
            except jsonschema.ValidationError:
                pass
        bodies = [
            ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 8, "response_format": {
                "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}),
            ("/v1/responses", {"model": MODEL, "input": USER, "max_output_tokens": 8,
                               "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}}),
            ("/v1/messages", {"model": MODEL, "messages": USER, "max_tokens": 8,
                              "tools": [{"name": "f", "input_schema": schema}]}),
        ]
        for path, body in bodies:
            status, data = server.request("POST", path, body)
            text = data.decode(errors="replace")
            if status != 400 or reason not in text:
                failures.append(f"{path} {reason}: status {status}: {text[:300]}")
    return failures


def unconstrained_request(seed):
    return "/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 1, "seed": seed,
                                    "max_tokens": 64}


def check_unconstrained(status, data):
    assert status == 200, f"status {status}: {data[:300]!r}"
    return json.loads(data)["usage"]["completion_tokens"], False


KINDS = {
    "json_object": (json_object_request, check_chat_json),
    "json_schema": (json_schema_request, check_json_schema),
    "regex": (regex_request, check_regex),
    "tool_required": (tool_required_request, check_tool_required),
    "named_tool": (named_tool_request, check_named_tool),
    "tool_auto": (tool_auto_request, check_tool_auto),
    "thinking_json_schema": (thinking_json_schema_request, check_thinking_json_schema),
    "keywords": (keywords_request, check_keywords),
}


def metrics(server):
    _, data = server.request("GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        m = re.match(r'(cedar_constrained_tokens_total|cedar_constraint_seconds_total|cedar_constraint_mask_seconds_total'
                     r'|cedar_constraint_budget_resamples_total|cedar_decode_seconds_total) (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
        m = re.match(r'cedar_engine_tokens_total\{kind="decode"\} (\S+)', line)
        if m:
            out["decode_tokens"] = float(m.group(1))
    return out


def run_kind(server, name, build, check, samples, workers):
    before = metrics(server)
    failures, tokens, cut_count = [], 0, 0
    t0 = time.monotonic()

    def one(seed):
        path, body = build(seed)
        status, data = server.request("POST", path, body)
        try:
            return check(status, data), None
        except Exception as e:  # noqa: BLE001  (any failure of any check is reported with its seed)
            return (0, False), f"seed {seed}: {type(e).__name__}: {str(e)[:300]}"

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for (n, cut), error in pool.map(one, range(1, samples + 1)):
            tokens += n
            cut_count += 1 if cut else 0
            if error:
                failures.append(error)
    wall = time.monotonic() - t0
    after = metrics(server)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    row = {"kind": name, "samples": samples, "valid": samples - len(failures), "cut_by_max_tokens": cut_count,
           "output_tokens_of_valid": tokens, "wall_s": round(wall, 2),
           "budget_resamples": int(d.get("cedar_constraint_budget_resamples_total", 0))}
    if d.get("decode_tokens"):
        row["decode_us_per_token"] = round(1e6 * d["cedar_decode_seconds_total"] / d["decode_tokens"], 1)
    if d.get("cedar_constrained_tokens_total"):
        per = 1e6 * d["cedar_constraint_seconds_total"] / d["cedar_constrained_tokens_total"]
        row["constraint_us_per_token"] = round(per, 1)
        # The masks' own computing time, most of it hidden behind the forward pass.
        row["mask_compute_us_per_token"] = round(
            1e6 * d.get("cedar_constraint_mask_seconds_total", 0) / d["cedar_constrained_tokens_total"], 1)
        if row.get("decode_us_per_token"):
            row["overhead_pct"] = round(100 * per / row["decode_us_per_token"], 1)
    return row, failures


def main():
    args = [a for a in sys.argv[1:]]
    samples, kinds, report = 20, list(KINDS), None
    if "--samples" in args:
        i = args.index("--samples")
        samples = int(args[i + 1])
        del args[i:i + 2]
    if "--kinds" in args:
        i = args.index("--kinds")
        kinds = args[i + 1].split(",")
        del args[i:i + 2]
    if "--report" in args:
        i = args.index("--report")
        report = args[i + 1]
        del args[i:i + 2]
    cedar, work = args[0], args[1]
    os.makedirs(work, exist_ok=True)
    tiny = os.path.join(work, "tiny")
    if not os.path.exists(os.path.join(tiny, "config.json")):
        subprocess.run([cedar, "make-tiny", "--out", tiny, "--seed", "5"], check=True, stdout=subprocess.DEVNULL)
    workers = 8
    # The prefix cache lets the samples of a kind share their prompt's prefill: only decode is paid.
    server = Server(cedar, ["-m", tiny, "--parallel", str(workers), "--cache-dir", os.path.join(work, "cache")],
                    os.path.join(work, "serve.log"))
    rows, failed = [], 0
    try:
        refused = check_refused(server)
        print(json.dumps({"refused_schemas": len(REFUSED), "failures": len(refused)}))
        for f in refused:
            print("   FAIL refused", f)
        failed += len(refused)
        base, _ = run_kind(server, "unconstrained", unconstrained_request, check_unconstrained, samples, workers)
        rows.append(base)
        for name in kinds:
            build, check = KINDS[name]
            row, failures = run_kind(server, name, build, check, samples, workers)
            rows.append(row)
            print(json.dumps(row))
            for f in failures[:5]:
                print("   FAIL", name, f)
            failed += len(failures)
    finally:
        server.stop()
    print(json.dumps(rows[0]))
    if report:
        with open(report, "w") as f:
            json.dump(rows, f, indent=1)
    print("%d kinds x %d samples: %s" % (len(kinds), samples, "all valid" if failed == 0 else "%d invalid" % failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
