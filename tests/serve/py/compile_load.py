#!/usr/bin/env python3
"""A huge constraint compiling must not hold up the other requests (issue 35, point 2).

  compile_load.py PATH/TO/cedar WORK_DIR [--regex-kb N] [--requests N] [--report FILE]

On a random tiny checkpoint (`cedar make-tiny`), `cedar serve` answers N ordinary chat requests and N
requests with a small regex constraint each (distinct patterns, so each compiles), all at once,
first on an idle server and then while one request with a regex of N KiB of plain alternations
compiles (the limits of issue 35 may refuse it first: then it is the largest load they let through,
which is the point). /health is probed throughout. It prints the latencies (median, p90, max) of
each class, idle and loaded, their ratio, /health's, and what the huge request got.

Exit 0 when every ordinary and small-constraint request got 200 and every probe of /health got
200, and the huge request got 200 or a 4xx (never a 5xx or no answer); 1 otherwise. Times are
reported, never asserted: CTest runs this as a correctness check on a small regex.
"""
import argparse
import concurrent.futures
import json
import os
import random
import statistics
import string
import subprocess
import sys
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from restart_test import Server, print_report, tiny_model  # noqa: E402  (the serve-process helper)

USER = [{"role": "user", "content": "Answer briefly."}]


def post(port, body, timeout=600):
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, time.monotonic() - t0, data


def health(port):
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, time.monotonic() - t0


def huge_regex(kib, seed=7):
    rng = random.Random(seed)
    words, size = [], 2
    while size < kib * 1024:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(8))
        words.append(w)
        size += len(w) + 1
    return "(" + "|".join(words) + ")"


def summary(times):
    if not times:
        return "none"
    s = sorted(times)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"median {statistics.median(s):.3f} s, p90 {p90:.3f} s, max {s[-1]:.3f} s"


def run_round(port, n, tag, probe_stop):
    """n ordinary + n small-constraint requests at once; returns (ordinary, constrained) latencies
    and the statuses that were not 200."""
    bodies = []
    for i in range(n):
        bodies.append(("ordinary", {"model": "tiny", "messages": USER, "max_tokens": 16, "temperature": 0}))
        regex = f"({tag}{i}|no{i}) [0-9]{{1,3}}"
        bodies.append(("constrained", {"model": "tiny", "messages": USER, "max_tokens": 16, "temperature": 0,
                                       "response_format": {"type": "regex", "regex": regex}}))
    out = {"ordinary": [], "constrained": []}
    bad = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = [(kind, pool.submit(post, port, body)) for kind, body in bodies]
        for kind, f in futures:
            status, seconds, data = f.result()
            out[kind].append(seconds)
            if status != 200:
                bad.append((kind, status, data[:200]))
    return out, bad


def probe(port, stop, results):
    while not stop.is_set():
        results.append(health(port))
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cedar")
    ap.add_argument("work")
    ap.add_argument("--regex-kb", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--report")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tiny = tiny_model(args.cedar, args.work, 5)
    server = Server(args.cedar, ["-m", tiny, "--parallel", "8", "--queue", "128"], os.path.join(args.work, "serve.log"))
    failures = []
    lines = []
    try:
        port = server.port
        # Warm-up: the grammar engine is built on the first constrained request.
        post(port, {"model": "tiny", "messages": USER, "max_tokens": 2,
                    "response_format": {"type": "regex", "regex": "(a|b)"}})

        stop = threading.Event()
        idle_health = []
        prober = threading.Thread(target=probe, args=(port, stop, idle_health))
        prober.start()
        idle, bad = run_round(port, args.requests, "idle", stop)
        stop.set()
        prober.join()
        failures += bad

        regex = huge_regex(args.regex_kb)
        huge = {}

        def send_huge():
            huge["status"], huge["seconds"], huge["body"] = post(
                port, {"model": "tiny", "messages": USER, "max_tokens": 16,
                       "response_format": {"type": "regex", "regex": regex}})

        huge_thread = threading.Thread(target=send_huge)
        huge_thread.start()
        time.sleep(0.5)  # its compilation is under way
        stop = threading.Event()
        loaded_health = []
        prober = threading.Thread(target=probe, args=(port, stop, loaded_health))
        prober.start()
        loaded, bad = run_round(port, args.requests, "busy", stop)
        stop.set()
        prober.join()
        failures += bad
        huge_thread.join()

        lines.append(f"huge regex: {len(regex)} bytes -> {huge['status']} after {huge['seconds']:.2f} s: "
                     f"{huge['body'][:160]!r}")
        if not (huge["status"] == 200 or 400 <= huge["status"] < 500):
            failures.append(("huge", huge["status"], huge["body"][:200]))
        for kind in ("ordinary", "constrained"):
            ratio = statistics.median(loaded[kind]) / max(1e-9, statistics.median(idle[kind]))
            lines.append(f"{args.requests} {kind}: idle {summary(idle[kind])}; while compiling "
                         f"{summary(loaded[kind])}; median ratio {ratio:.2f}")
        lines.append(f"/health idle: {summary([s for _, s in idle_health])} ({len(idle_health)} probes); "
                     f"while compiling: {summary([s for _, s in loaded_health])} ({len(loaded_health)} probes)")
        for status, _ in idle_health + loaded_health:
            if status != 200:
                failures.append(("health", status, b""))
    finally:
        t0 = time.monotonic()
        try:
            server.stop()
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
        # A compilation past its deadline still runs on its thread (xgrammar cannot be interrupted),
        # and a clean shutdown waits for it.
        lines.append(f"shutdown took {time.monotonic() - t0:.2f} s")
    print_report(lines, args.report)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
