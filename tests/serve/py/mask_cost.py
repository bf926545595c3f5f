#!/usr/bin/env python3
"""One costly constraint must not slow the batch (issue 35, point 5).

  mask_cost.py PATH/TO/cedar WORK_DIR [--regex R] [--report FILE]

On a random tiny checkpoint, a plain 32-token request runs alone, then beside a request whose regex
(default `(a{1000}){1000}`, ~190 ms of mask per token before issue 35) makes every mask costly. It
prints the plain request's latency both ways and, from /metrics, the steps constrained sequences
sat out waiting for their masks. Reported, not asserted. Exit 0 when every request got an answer
(the costly one 200 or 4xx: the constraint limits may refuse it before any work).
"""
import argparse
import json
import os
import re
import sys
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from restart_test import Server, print_report, tiny_model  # noqa: E402
from compile_load import post  # noqa: E402

USER = [{"role": "user", "content": "Answer briefly."}]


def metric(port, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        m = re.match(re.escape(name) + r"(\{[^}]*\})? (\S+)", line)
        if m:
            return float(m.group(2))
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cedar")
    ap.add_argument("work")
    ap.add_argument("--regex", default="(a{1000}){1000}")
    ap.add_argument("--report")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tiny = tiny_model(args.cedar, args.work, 5)
    server = Server(args.cedar, ["-m", tiny, "--grammar-compile-timeout", "120"], os.path.join(args.work, "serve.log"))
    plain = {"model": "tiny", "messages": USER, "max_tokens": 32, "temperature": 0, "stop": []}
    lines, ok = [], True
    try:
        port = server.port
        post(port, plain)  # warm-up
        status, alone, _ = post(port, plain)
        ok &= status == 200
        costly = {}
        body = {"model": "tiny", "messages": USER, "max_tokens": 64, "temperature": 0,
                "response_format": {"type": "regex", "regex": args.regex}}
        # Compiled first (so the measurement below is the masks, not the compilation).
        costly["status"], costly["compile"], costly["body"] = post(port, dict(body, max_tokens=1))
        t = threading.Thread(target=lambda: costly.update(zip(("status", "seconds", "body"), post(port, body))))
        t.start()
        time.sleep(0.5)
        status, beside, _ = post(port, plain)
        ok &= status == 200
        t.join()
        ok &= costly["status"] == 200 or 400 <= costly["status"] < 500
        lines.append(f"plain 32-token request alone: {alone:.3f} s; beside {args.regex!r}: {beside:.3f} s "
                     f"(ratio {beside / alone:.2f})")
        lines.append(f"costly request: {costly['status']} in {costly['seconds']:.2f} s "
                     f"(first compile+1 token {costly['compile']:.2f} s)")
        lines.append(f"mask seconds {metric(port, 'cedar_constraint_mask_seconds_total')}, "
                     f"constrained tokens {metric(port, 'cedar_constrained_tokens_total')}, "
                     f"parked steps {metric(port, 'cedar_constraint_parked_steps_total')}")
    finally:
        server.stop()
    print_report(lines, args.report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
