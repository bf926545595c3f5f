#!/usr/bin/env python3
"""A conversation across a server restart, on the real engine (a tiny random checkpoint).

  restart_test.py PATH/TO/cedar [WORK_DIR]

Turn 1 runs on `cedar serve -m TINY --cache-dir DIR`; the server is stopped (SIGTERM) and started
again on the same directory; turn 2 (turn 1 + the answer + a new user message) must report
usage.prompt_tokens_details.cached_tokens >= turn 1's prompt_tokens and do bounded work: the engine
runs only the new tokens plus one replayed window (/metrics: cedar_engine_tokens_total). The same
turn 2 on a server without a cache is the cold comparison. Standard library only; prints the
measured figures.
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
    if not ok:
        FAILURES.append(name)


def tiny_model(cedar, work, seed):
    """A random tiny checkpoint in WORK/tiny (`cedar make-tiny`), made once; returns its folder."""
    tiny = os.path.join(work, "tiny")
    if not os.path.exists(os.path.join(tiny, "config.json")):
        subprocess.run([cedar, "make-tiny", "--out", tiny, "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return tiny


def print_report(lines, path):
    """Prints the measured lines and, with a path, writes them there too."""
    for line in lines:
        print(line)
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


class Server:
    def __init__(self, cedar, args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([cedar, "serve", "--port", "0"] + args, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", open(log_path).read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if self.port is None:
            raise RuntimeError("server did not start:\n" + open(log_path).read())

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    def chat(self, messages, max_tokens):
        t0 = time.monotonic()
        status, data = self.request("POST", "/v1/chat/completions",
                                    {"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                                     "temperature": 0, "thinking": {"type": "disabled"}})
        if status != 200:
            raise RuntimeError(f"chat returned {status}: {data[:400]!r}")
        return json.loads(data), time.monotonic() - t0

    def engine_tokens(self):
        _, data = self.request("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            m = re.match(r'cedar_engine_tokens_total\{kind="(\w+)"\} (\S+)', line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        self.log.close()
        return code


def main():
    cedar = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cedar_restart_")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tiny, cache = os.path.join(work, "tiny"), os.path.join(work, "cache")
    subprocess.run([cedar, "make-tiny", "--out", tiny, "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    window = json.load(open(os.path.join(tiny, "config.json")))["text_config"]["sliding_window"]

    system = ("You are a careful assistant for a self-hosted DeepSeek-V4.1 server. " * 12).strip()
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Summarise the plan in one line."}]

    server = Server(cedar, ["-m", tiny, "--cache-dir", cache], os.path.join(work, "serve1.log"))
    r1, t1 = server.chat(turn1, 24)
    p1 = r1["usage"]["prompt_tokens"]
    answer = r1["choices"][0]["message"]["content"]
    check("turn 1 starts cold", r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0)
    check("server stops cleanly (SIGTERM)", server.stop() == 0)

    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "Now list the three steps."}]
    server = Server(cedar, ["-m", tiny, "--cache-dir", cache], os.path.join(work, "serve2.log"))
    before = server.engine_tokens()
    r2, t2 = server.chat(turn2, 8)
    after = server.engine_tokens()
    server.stop()
    p2 = r2["usage"]["prompt_tokens"]
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    computed = after["computed_prompt"] - before.get("computed_prompt", 0)
    replayed = after["replayed"] - before.get("replayed", 0)

    cold = Server(cedar, ["-m", tiny], os.path.join(work, "serve_cold.log"))
    before = cold.engine_tokens()
    r3, t3 = cold.chat(turn2, 8)
    cold_computed = cold.engine_tokens()["computed_prompt"] - before.get("computed_prompt", 0)
    cold.stop()

    print(f"turn 1: {p1} prompt tokens, {t1:.2f} s; after the restart turn 2: {p2} prompt tokens, "
          f"{cached} cached, {replayed:.0f} replayed (window {window}), {computed:.0f} computed, {t2:.2f} s; "
          f"cold turn 2: {cold_computed:.0f} computed, {t3:.2f} s")
    check("turn 2 reuses all of turn 1's prompt", cached >= p1, f"cached {cached}, turn-1 prompt {p1}")
    check("turn 2 replays at most one window", 0 < replayed <= window, f"{replayed:.0f}")
    check("turn 2 computes only the new tokens and the window", computed == p2 - cached + replayed,
          f"{computed:.0f} == {p2} - {cached} + {replayed:.0f}")
    check("bounded work: far less than a cold prefill", computed <= p2 - p1 + window < cold_computed,
          f"{computed:.0f} vs cold {cold_computed:.0f}")
    check("the cold server computes the whole prompt", cold_computed == p2)
    if not FAILURES:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
