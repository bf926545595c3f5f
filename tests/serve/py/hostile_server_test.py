#!/usr/bin/env python3
"""Hostile requests against a real `cedar serve` (a random tiny checkpoint), as an attacker would send them.

  hostile_server_test.py PATH/TO/cedar WORK_DIR [--measure] [--only=NAME]   (NAME: part of a case's name)

Every case of issue 35 that a client can send: each must get its 4xx (naming what to fix) or its
correct answer, the process must stay alive, and its resident memory must stay bounded (VmRSS read
from /proc/PID/status after each group, against the first reading plus a fixed allowance). All
traffic goes to 127.0.0.1 and every loop is bounded. No timing is asserted; `--measure` adds the
latency comparison of issue 35 (ordinary and small-constraint requests while a 1 MB regex compiles,
against an idle server) and prints it.
Standard library only.
"""
import concurrent.futures
import http.client
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from restart_test import Server, tiny_model  # noqa: E402

FAILURES = []
MODEL = "tiny"
MiB = 1 << 20
# What any one hostile group may add to the server's resident memory. The model is tiny (a few
# MiB); the largest legitimate allocation here is a 16 MiB body and its parse.
RSS_ALLOWANCE = 512 * MiB


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        FAILURES.append(name)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def post(server, path, body, timeout=120, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    return resp.status, out


def error_text(data):
    try:
        body = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    err = body.get("error", body)
    return err.get("message", "") if isinstance(err, dict) else str(err)


def chat(messages="Hi", **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": messages}], "max_tokens": 8, "temperature": 0}
    body.update(extra)
    return body


def schema_chat(schema):
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})


def schema_responses(schema):
    return {"model": MODEL, "input": "Hi", "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}}


def schema_messages(schema):
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}


SCHEMA_APIS = [("chat", "/v1/chat/completions", schema_chat), ("responses", "/v1/responses", schema_responses),
               ("messages", "/v1/messages", schema_messages)]


class Group:
    """A group of cases: the server must be alive and within its memory allowance afterwards."""

    def __init__(self, server, name):
        self.server, self.name = server, name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        alive = self.server.proc.poll() is None
        check(f"{self.name}: server alive", alive, "" if alive else f"exit code {self.server.proc.returncode}")
        if alive:
            grown = rss_bytes(self.server.proc.pid) - self.server.rss0
            check(f"{self.name}: RSS bounded", grown < RSS_ALLOWANCE, f"{grown / MiB:+.0f} MiB over the start")
            status, _ = self.server.request("GET", "/health")
            check(f"{self.name}: /health answers", status == 200, f"status {status}")
        return False


def expect_4xx(name, status, data, words=()):
    text = error_text(data)
    ok = 400 <= status < 500 and all(w.lower() in text.lower() for w in words)
    check(name, ok, f"{status} {text[:160]!r}")


def case_pathological_regex(server):
    with Group(server, "1 repetition bounds"):
        for regex in ("a{99999999999}", "a{10000000}", "(a{1000}){1000}", "((a{100}){100}){100}"):
            status, data = post(server, "/v1/chat/completions", chat(response_format={"type": "regex", "regex": regex}))
            expect_4xx(f"regex {regex}", status, data)
        for api, path, build in SCHEMA_APIS:
            schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "a{99999999999}"}},
                      "required": ["s"]}
            status, data = post(server, path, build(schema))
            expect_4xx(f"pattern a{{99999999999}} via {api}", status, data)
            schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 100000000}}}
            status, data = post(server, path, build(schema))
            expect_4xx(f"maxLength 1e8 via {api}", status, data)


UNENFORCED = {
    "not": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
    "oneOf": {"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
    "contains": {"type": "object", "properties": {"a": {"type": "array", "contains": {"const": 3}}}},
    "if": {"type": "object", "properties": {"a": {"type": "integer"}}, "if": {"required": ["a"]},
           "then": {"required": ["b"]}},
    "dependentRequired": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentRequired": {"a": ["b"]}},
    "type": {"type": "object", "properties": {"a": {"type": []}}},
}


def case_schema_keywords(server):
    with Group(server, "8 schema keywords"):
        for keyword, schema in UNENFORCED.items():
            for api, path, build in SCHEMA_APIS:
                status, data = post(server, path, build(schema))
                if status == 200:
                    check(f"{keyword} via {api} refused or enforced", False, "200: the keyword is not enforced")
                else:
                    expect_4xx(f"{keyword} via {api}", status, data, words=(keyword,))
        for name, schema in (("anyOf [$ref #]", {"anyOf": [{"$ref": "#"}]}), ("enum []", {"enum": []}),
                             ("false", {"type": "object", "properties": {"a": False}, "required": ["a"]})):
            status, data = post(server, "/v1/chat/completions", schema_chat(schema))
            expect_4xx(f"unsatisfiable schema {name}", status, data)
        for regex in (r"[^\s\S]", r"a[^\s\S]"):  # no output at all / a dead end after one character
            body = chat(response_format={"type": "regex", "regex": regex}, thinking={"type": "disabled"})
            status, data = post(server, "/v1/chat/completions", body)
            expect_4xx(f"unsatisfiable regex {regex}", status, data)


def case_json_bodies(server):
    with Group(server, "4 JSON bodies"):
        keys = 400_000
        big = b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":1,"x":{' + \
            b",".join(b'"k%d":0' % i for i in range(keys)) + b"}}"
        t0 = time.monotonic()
        status, data = post(server, "/v1/chat/completions", None, raw=big)
        check("400k keys answered", status in (200, 400, 413), f"{status} in {time.monotonic() - t0:.2f} s "
              f"({len(big) / MiB:.1f} MiB): {error_text(data)[:120]!r}")
        n = (15 * MiB) // 3
        empties = b"[" + b",".join([b"{}"] * n) + b"]"
        body = b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":1,"x":' + empties + b"}"
        t0 = time.monotonic()
        status, data = post(server, "/v1/chat/completions", None, raw=body)
        check("15 MiB of {} answered", status in (200, 400, 413),
              f"{status} in {time.monotonic() - t0:.2f} s: {error_text(data)[:120]!r}")
        deep = b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"x":' + b"[" * 100000 + b"]" * 100000 + b"}"
        status, data = post(server, "/v1/chat/completions", None, raw=deep)
        expect_4xx("100k nested arrays", status, data)


def case_schema_cache(server):
    with Group(server, "3 distinct schemas"):
        for i in range(200):
            schema = {"type": "object", "properties": {f"field_{i}_{j}": {"type": "integer"} for j in range(8)}}
            status, data = post(server, "/v1/chat/completions", schema_chat(schema))
            if status != 200:
                check(f"schema {i}", False, f"{status} {error_text(data)[:160]!r}")
                break
        check("200 distinct schemas answered", status == 200)


def case_tools(server):
    with Group(server, "9 tools"):
        tools = [{"type": "function", "function": {"name": 'get"weather', "parameters": {"type": "object"}}}]
        status, data = post(server, "/v1/chat/completions", chat(tools=tools))
        expect_4xx("tool name get\"weather", status, data)
        weather = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
        bad = []
        for budget in (1, 2, 5, 10, 20, 40, 80, 120, 160):
            body = chat(tools=tools, tool_choice="required", max_tokens=budget, temperature=1, seed=budget)
            body["thinking"] = {"type": "disabled"}
            status, data = post(server, "/v1/chat/completions", body)
            if 400 <= status < 500:
                continue  # the budget cannot hold a complete call: refused up front
            if status != 200:
                bad.append(f"{budget}: {status}")
                continue
            calls = json.loads(data)["choices"][0]["message"].get("tool_calls") or []
            try:
                if not calls:
                    raise ValueError("no call")
                for call in calls:
                    args = json.loads(call["function"]["arguments"])
                    if not isinstance(args, dict) or "city" not in args or "days" not in args:
                        raise ValueError(f"arguments {args!r}")
            except ValueError as e:
                bad.append(f"{budget}: {e}")
        check("forced tool calls complete or refused at every max_tokens", not bad, "; ".join(bad))


def case_chunked_trailer(server):
    """A chunked body whose trailer is over 64 KiB: as one field, and as many small ones."""
    with Group(server, "9 chunked trailer"):
        body = b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":1}'
        for shape, trailer in (("one field", b"X-Big: " + b"v" * 70000 + b"\r\n"),
                               ("2048 fields", b"".join(b"X-T%04d: " % i + b"v" * 54 + b"\r\n" for i in range(2048)))):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n")
            t0 = time.monotonic()
            try:
                s.sendall(trailer + b"\r\n")
            except OSError:
                pass  # the server may close once the limit is passed
            try:
                reply = s.recv(256)
            except OSError as e:
                reply = str(e).encode()
            s.close()
            # Answered (a 4xx, or the completion when the trailer is within limits) or closed: never left waiting.
            check(f"trailer over 64 KiB ({shape}) answered", reply.startswith(b"HTTP/1.1 ") or reply == b"",
                  f"{reply[:40]!r} after {time.monotonic() - t0:.2f} s")


def measure(server, work):
    """Latency of 20 ordinary + 20 small-constraint requests, idle and while a 1 MB regex compiles."""
    small = chat(response_format={"type": "regex", "regex": "(yes|no) [a-z]{1,4}"})

    def batch():
        bodies = [chat(f"ordinary {i}") for i in range(20)] + [dict(small, seed=i) for i in range(20)]
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            def one(body):
                t0 = time.monotonic()
                status, _ = post(server, "/v1/chat/completions", body, timeout=600)
                return status, time.monotonic() - t0
            return list(pool.map(one, bodies))

    batch()  # warm: the small grammar is compiled once
    idle = batch()
    words = [f"w{i:06d}x" for i in range(110_000)]
    big = "(" + "|".join(words) + ")"
    print(f"regex of {len(big) / MiB:.2f} MiB")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        fut = pool.submit(post, server, "/v1/chat/completions", chat(response_format={"type": "regex", "regex": big}),
                          600)
        time.sleep(0.5)
        loaded = batch()
        h0 = time.monotonic()
        server.request("GET", "/health")
        health = time.monotonic() - h0
        status, data = fut.result()
        big_s = time.monotonic() - t0
    med = lambda rows: statistics.median(t for _, t in rows)  # noqa: E731
    worst = lambda rows: max(t for _, t in rows)  # noqa: E731
    print(json.dumps({"idle_median_s": round(med(idle), 3), "idle_max_s": round(worst(idle), 3),
                      "loaded_median_s": round(med(loaded), 3), "loaded_max_s": round(worst(loaded), 3),
                      "ratio_median": round(med(loaded) / med(idle), 2), "ratio_max": round(worst(loaded) / worst(idle), 2),
                      "health_s": round(health, 3), "big_regex_status": status, "big_regex_s": round(big_s, 2),
                      "big_regex_reply": error_text(data)[:160]}))
    check("requests during the big compile answered", all(s == 200 for s, _ in loaded))


def main():
    cedar, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    tiny = tiny_model(cedar, work, 11)
    server = Server(cedar, ["-m", tiny, "--parallel", "8"], os.path.join(work, "serve.log"))
    try:
        server.request("GET", "/health")
        post(server, "/v1/chat/completions", chat())
        server.rss0 = rss_bytes(server.proc.pid)
        print(f"server RSS at start: {server.rss0 / MiB:.0f} MiB")
        cases = (case_pathological_regex, case_schema_keywords, case_json_bodies, case_schema_cache, case_tools,
                 case_chunked_trailer)
        only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]
        for case in cases:
            if not only or any(o in case.__name__ for o in only):
                case(server)
        if "--measure" in sys.argv:
            measure(server, work)
    finally:
        if server.proc.poll() is None:
            server.stop()
    print(f"{len(FAILURES)} failed" if FAILURES else "all cases passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
