#!/usr/bin/env python3
"""Checks cedar's responses and stream events against DeepSeek's protocol library (PyPI
deepseek-recipe 0.2.0) on the scripted completions of outputs.jsonl, for Chat Completions,
Responses and Messages.

cedar side: `cedar serve --scripted` plays each completion (through the real encoder, queue,
streaming parser and wire formats, on the byte-level test tokenizer); each case is sent once
without and once with streaming. deepseek-recipe side: the same request body is converted
(`*Request(body).convert(...)`), and its stream processor (`StreamProcessor` over the API's chunk
generator and the request's parsing options) is fed the completion token by token, ending with
`finish(Length)` when max_tokens cut it; its non-streaming response is the stream accumulated by
the API's `*Response.accumulate`. A case's "format" (json_object, json_schema, regex) becomes the
request's response_format / text.format; such cases run on Chat Completions and Responses only.

Compared are the semantic fields: content, reasoning, tool call names and arguments, finish / stop
reasons and stop sequences, output item and block types, and the event sequence (event types in
order, consecutive deltas of one part merged, their text concatenated). Ids, timestamps, usage,
signatures, `ping` events and Responses' `phase` are left out.

    check_outputs.py CEDAR_BINARY [outputs.jsonl] [--show N] [--only NAME_PREFIX]

Exit status: 0 when every comparison is equal or one of the documented differences (KNOWN below,
each counted and printed), 1 otherwise.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import deepseek_recipe as dr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from make_test_tokenizer import bytes_to_unicode  # noqa: E402  (GPT-2's byte-level alphabet)

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_DIR = os.path.join(HERE, "..", "data", "tokenizer")
MODEL = "DeepSeek-V4.1-Flash"
EOS = "<｜end▁of▁sentence｜>"
OPTIONS = dr.ConversionOptions()  # the defaults, as `cedar serve` (a body below always names its mode)




def load_vocab():
    """(markers longest first, marker -> id, byte -> id) of the test tokenizer: one token per control
    marker, one per byte for everything else."""
    with open(os.path.join(TOKENIZER_DIR, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    vocab = tokenizer["model"]["vocab"]
    byte_ids = {b: vocab[ch] for b, ch in bytes_to_unicode().items()}
    return sorted(added, key=len, reverse=True), added, byte_ids


MARKERS, MARKER_IDS, BYTE_IDS = load_vocab()


def token_pieces(case):
    """The completion as the test tokenizer splits it, as (bytes, is_special_token): markers whole,
    every other byte alone. Inside the case's "plain" ranges (code point offsets [start, end)), a
    marker's spelling is written with ordinary tokens, one per byte, as a model can write it."""
    text = case["completion"]
    plain = [False] * len(text)
    for start, end in case.get("plain") or []:
        plain[start:end] = [True] * (end - start)
    pieces, i = [], 0
    while i < len(text):
        m = None if plain[i] else next((m for m in MARKERS if text.startswith(m, i)), None)
        if m:
            pieces.append((m.encode(), True))
            i += len(m)
        else:
            pieces.extend((bytes([b]), False) for b in text[i].encode())
            i += 1
    return pieces


def token_ids(pieces):
    return [MARKER_IDS[p.decode()] if special else BYTE_IDS[p[0]] for p, special in pieces]


# ---- Request bodies.

TOOL_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
TOOL_NAMES = ["get_weather", "search_docs", "run_sql", "now", "a", "b", "x"] + ["tool_%d" % k for k in range(4)]


# A case's "format" as each API writes it (json_object: deepseek-recipe's parse_json_output).
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}
CHAT_FORMATS = {"json_object": {"type": "json_object"},
                "json_schema": {"type": "json_schema", "json_schema": {"name": "answer", "schema": JSON_SCHEMA}},
                "regex": {"type": "regex", "regex": ".*"}}
RESPONSES_FORMATS = {"json_object": {"type": "json_object"},
                     "json_schema": {"type": "json_schema", "name": "answer", "schema": JSON_SCHEMA}}


def body_for(api, case):
    user = "case %s" % case["name"]
    fmt = case.get("format")
    if api == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": user}]}
        if case["tools"]:
            body["tools"] = [{"type": "function", "function": {"name": n, "parameters": TOOL_PARAMS}} for n in TOOL_NAMES]
        if case["thinking"]:
            body["reasoning_effort"] = "high"
        else:
            body["thinking"] = {"type": "disabled"}
        if case["stop"]:
            body["stop"] = case["stop"]
        if case["max_tokens"]:
            body["max_tokens"] = case["max_tokens"]
        if fmt:
            body["response_format"] = CHAT_FORMATS[fmt]
        if case.get("prefix"):  # continue this assistant message
            prefix = case["prefix"]
            message = {"role": "assistant", "content": prefix["content"], "prefix": True}
            if prefix["reasoning"] is not None:
                message["reasoning_content"] = prefix["reasoning"]
            body["messages"].append(message)
    elif api == "responses":
        body = {"model": MODEL, "input": user}
        if case["tools"]:
            body["tools"] = [{"type": "function", "name": n, "parameters": TOOL_PARAMS} for n in TOOL_NAMES]
        body["reasoning"] = {"effort": "high" if case["thinking"] else "none"}
        if case["max_tokens"]:
            body["max_output_tokens"] = case["max_tokens"]
        if fmt:
            body["text"] = {"format": RESPONSES_FORMATS[fmt]}
    else:
        body = {"model": MODEL, "max_tokens": case["max_tokens"] or 4096, "messages": [{"role": "user", "content": user}]}
        if case["tools"]:
            body["tools"] = [{"name": n, "input_schema": TOOL_PARAMS} for n in TOOL_NAMES]
        if case["thinking"]:
            body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
        else:
            body["thinking"] = {"type": "disabled"}
        if case["stop"]:
            body["stop_sequences"] = case["stop"]
    return body


def applies(api, case):
    if case.get("prefix") and api != "chat":
        return False  # only Chat Completions can continue an assistant message
    if api == "responses" and case["stop"]:
        return False  # the Responses API has no stop strings
    fmt = case.get("format")
    if fmt and api == "messages":
        return False  # Messages has no json_object format, and deepseek-recipe reads its answers as usual
    return not (fmt and api == "responses" and fmt not in RESPONSES_FORMATS)


# ---- deepseek-recipe.

RECIPE = {"chat": (dr.ChatCompletionRequest, dr.ChatCompletionResponse),
          "responses": (dr.ResponsesRequest, dr.ResponsesResponse),
          "messages": (dr.MessagesRequest, dr.MessagesResponse)}


RECIPE_TOKENIZER = dr.Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))


def recipe_run(api, case):
    """(events, response) as deepseek-recipe produces them for this completion. The processor gets
    token ids and the tokenizer, as a backend drives it: it decodes each special token as its own
    piece and matches a marker's special-token part only against one, so a marker spelled with
    ordinary tokens is text."""
    request_cls, response_cls = RECIPE[api]
    converted = request_cls(body_for(api, case)).convert(OPTIONS)
    processor = dr.StreamProcessor(request_cls.chunk_generator(converted, "id", MODEL), converted.parsing_options,
                                   RECIPE_TOKENIZER)
    pieces = token_pieces(case)
    cut = case["max_tokens"] is not None and case["max_tokens"] < len(pieces)
    if cut:
        pieces = pieces[:case["max_tokens"]]
    chunks = processor.push(dr.InferenceChunk.ready())
    for piece in pieces:  # one token at a time; the decoder holds a character's bytes until it is whole
        if piece == (EOS.encode(), True):  # a backend reports EOS as the end of the stream, not as text
            cut = False
            break
        if processor.finished:
            break
        chunks += processor.push(dr.InferenceChunk.tokens(token_ids([piece])))
    if not processor.finished:
        reason = dr.InferenceFinishReason.Length if cut else dr.InferenceFinishReason.Stop
        chunks += processor.push(dr.InferenceChunk.finish(reason))
        chunks += processor.finish()
    events = [json.loads(c.to_json()) for c in chunks]  # before accumulate() consumes them
    response = response_cls("id", MODEL, 0, 0, 0)
    for c in chunks:
        response.accumulate(c)
    return events, json.loads(response.to_json())


# ---- cedar.

def start_cedar(cedar, cases, workdir):
    def reply(c):
        # Completions with ordinary-token marker spellings go as ids (text would encode the
        # spelling as the marker token).
        if c.get("plain"):
            return {"when_prompt_contains": "case %s<" % c["name"], "completion_ids": token_ids(token_pieces(c))}
        return {"when_prompt_contains": "case %s<" % c["name"], "completion": c["completion"]}
    script = {"token_delay_ms": 0, "replies": [reply(c) for c in cases]}
    path = os.path.join(workdir, "script.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(script, f, ensure_ascii=False)
    proc = subprocess.Popen([cedar, "serve", "--scripted", path, "--tokenizer", TOKENIZER_DIR, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    sys.exit("cedar serve did not start")


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def cedar_run(url, api, case, stream):
    body = dict(body_for(api, case), stream=stream)
    req = urllib.request.Request(url + PATHS[api], data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        return {"http_error": e.code, "body": e.read().decode()}
    if not stream:
        return json.loads(text)
    events = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and line[6:] != "[DONE]":
                events.append(json.loads(line[6:]))
    return events


# ---- Semantic forms.

def merge(seq):
    """Consecutive ("delta", key, text) entries of the same key become one, their texts joined."""
    out = []
    for e in seq:
        if out and e[0] == "delta" and out[-1][0] == "delta" and out[-1][1] == e[1]:
            out[-1] = ("delta", e[1], out[-1][2] + e[2])
        else:
            out.append(e)
    return [list(e) for e in out]


def chat_response(r):
    m = r["choices"][0]["message"]
    return {"content": m.get("content") or "", "reasoning": m.get("reasoning_content") or "",
            "tool_calls": [[c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls") or []],
            "finish_reason": r["choices"][0]["finish_reason"]}


def chat_events(events):
    seq = []
    for e in events:
        for choice in e.get("choices", []):
            d = choice.get("delta", {})
            if d.get("role"):
                seq.append(("role", d["role"]))
            if d.get("reasoning_content"):
                seq.append(("delta", "reasoning", d["reasoning_content"]))
            if d.get("content"):
                seq.append(("delta", "content", d["content"]))
            for tc in d.get("tool_calls") or []:
                if tc.get("function", {}).get("name"):
                    seq.append(("tool_call", tc["index"], tc["function"]["name"]))
                if tc.get("function", {}).get("arguments"):
                    seq.append(("delta", "arguments %d" % tc["index"], tc["function"]["arguments"]))
            if choice.get("finish_reason"):
                seq.append(("finish", choice["finish_reason"]))
        if "error" in e:
            seq.append(("error",))
    return merge(seq)


def responses_item(item):
    if item["type"] == "message":
        return ["message", "".join(p.get("text", "") for p in item["content"]), item.get("status")]
    if item["type"] == "reasoning":
        return ["reasoning", "".join(p.get("text", "") for p in item.get("content") or []), item.get("status")]
    if item["type"] == "function_call":
        return ["function_call", item["name"], item["arguments"], item.get("status")]
    return [item["type"]]


def responses_response(r):
    return {"status": r["status"], "incomplete": (r.get("incomplete_details") or {}).get("reason"),
            "output": [responses_item(i) for i in r["output"]]}


def responses_events(events):
    seq = []
    for e in events:
        t = e["type"]
        if t.endswith(".delta"):
            seq.append(("delta", t + " %d" % e["output_index"], e["delta"]))
        elif t in ("response.output_item.added", "response.output_item.done"):
            seq.append((t, responses_item(e["item"])))
        elif t in ("response.created", "response.in_progress"):
            seq.append((t,))
        elif t in ("response.completed", "response.incomplete", "response.failed"):
            seq.append((t, responses_response(e["response"])))
        elif t == "response.output_text.done":
            seq.append((t, e["text"]))
        elif t == "response.reasoning_text.done":
            seq.append((t, e["text"]))
        elif t == "response.function_call_arguments.done":
            seq.append((t, e["arguments"]))
        elif t in ("response.content_part.added", "response.content_part.done"):
            seq.append((t, e["part"]["type"], e["part"].get("text", "")))
        else:
            seq.append((t,))
    return merge(seq)


def messages_block(b):
    if b["type"] == "text":
        return ["text", b["text"]]
    if b["type"] == "thinking":
        return ["thinking", b["thinking"]]
    if b["type"] == "tool_use":
        return ["tool_use", b["name"], b["input"]]
    return [b["type"]]


def messages_response(r):
    return {"content": [messages_block(b) for b in r["content"]], "stop_reason": r["stop_reason"],
            "stop_sequence": r.get("stop_sequence")}


def messages_events(events):
    seq = []
    for e in events:
        t = e["type"]
        if t == "ping":
            continue
        if t == "content_block_start":
            seq.append((t, e["content_block"]["type"], e["content_block"].get("name")))
        elif t == "content_block_delta":
            d = e["delta"]
            if d["type"] == "signature_delta":
                continue
            text = d.get("text", d.get("thinking", d.get("partial_json", "")))
            seq.append(("delta", "%s %d" % (d["type"], e["index"]), text))
        elif t == "message_delta":
            seq.append((t, e["delta"].get("stop_reason"), e["delta"].get("stop_sequence")))
        else:
            seq.append((t,))
    return merge(seq)


FORMS = {"chat": (chat_response, chat_events), "responses": (responses_response, responses_events),
         "messages": (messages_response, messages_events)}


# Differences cedar keeps on purpose (docs/SERVER.md, "Responses and stream events"): predicates on
# (api, mode, case, cedar form, recipe form), each with a docstring saying why. None at present.
KNOWN = []


def main():
    parser = argparse.ArgumentParser(description="cedar's responses and stream events against deepseek-recipe")
    parser.add_argument("cedar")
    parser.add_argument("outputs", nargs="?", default=os.path.join(HERE, "outputs.jsonl"))
    parser.add_argument("--show", type=int, default=10, help="differences to print")
    parser.add_argument("--only", default="", help="only the cases whose name starts so (to debug)")
    opts = parser.parse_args()
    cedar, show = opts.cedar, opts.show
    with open(opts.outputs, encoding="utf-8") as f:
        cases = [c for c in (json.loads(line) for line in f if line.strip()) if c["name"].startswith(opts.only)]
    tally = {}
    differences, known = [], []
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_cedar(cedar, cases, workdir)
        try:
            for case in cases:
                for api in ("chat", "responses", "messages"):
                    if not applies(api, case):
                        continue
                    recipe_events, recipe_response = recipe_run(api, case)
                    to_response, to_events = FORMS[api]
                    for mode in ("response", "stream"):
                        got = cedar_run(url, api, case, mode == "stream")
                        if isinstance(got, dict) and "http_error" in got:
                            ours = got
                        else:
                            ours = to_response(got) if mode == "response" else to_events(got)
                        theirs = to_response(recipe_response) if mode == "response" else to_events(recipe_events)
                        key = (api, mode)
                        t = tally.setdefault(key, [0, 0, 0])
                        t[0] += 1
                        if ours == theirs:
                            t[1] += 1
                        elif any(k(api, mode, case, ours, theirs) for k in KNOWN):
                            t[2] += 1
                            known.append((case["name"], api, mode))
                        else:
                            differences.append((case["name"], api, mode, ours, theirs))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    for (api, mode), (n, equal, documented) in sorted(tally.items()):
        print("%-9s %-8s %3d compared, %3d equal, %2d documented differences, %2d other" %
              (api, mode, n, equal, documented, n - equal - documented))
    if known:
        print("documented differences:", ", ".join("%s/%s/%s" % k for k in known))
    for name, api, mode, ours, theirs in differences[:show]:
        print("\nDIFF %s %s %s\n  cedar : %s\n  recipe: %s" % (name, api, mode, json.dumps(ours, ensure_ascii=False),
                                                            json.dumps(theirs, ensure_ascii=False)))
    if differences:
        by_case = {}
        for name, api, mode, _, _ in differences:
            by_case.setdefault(name, []).append("%s/%s" % (api, mode))
        print("\ndiffering cases:")
        for name, where in by_case.items():
            print("  %s: %s" % (name, " ".join(where)))
    print("%d of %d comparisons differ" % (len(differences), sum(t[0] for t in tally.values())))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
