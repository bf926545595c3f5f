#!/usr/bin/env python3
"""The server's memory over many distinct schemas stays within the grammar cache budget (issue 35, point 3).

  grammar_cache_rss.py PATH/TO/cedar WORK_DIR [--schemas N] [--cache SIZE] [--report FILE]

On a random tiny checkpoint (the V4 vocabulary: ~12 MB of compiled grammar per schema), N requests
with distinct json_schema response formats go to `cedar serve --grammar-cache SIZE`; the server's
VmRSS (/proc/PID/status) is read after a warm-up request and after the last one. Reported, not
asserted (GrammarCache.AThousandDistinctSchemasStayWithinTheBudget asserts the bound in CI).
Exit 0 when every request got 200.
"""
import argparse
import concurrent.futures
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from restart_test import Server, print_report, tiny_model  # noqa: E402
from compile_load import post  # noqa: E402

USER = [{"role": "user", "content": "Reply in JSON."}]


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def body(i, same_schema=False):
    # The schema's name is in the prompt too; --same-schema keeps the prompts as distinct (the
    # prefix cache and the rest of the server grow as with distinct schemas) and the grammar the same.
    k = 0 if same_schema else i
    schema = {"type": "object", "properties": {f"field_{k}": {"type": "string"}, "n": {"type": "integer"}},
              "required": [f"field_{k}"]}
    user = [{"role": "user", "content": f"Reply in JSON ({i})."}]
    return {"model": "tiny", "messages": user, "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cedar")
    ap.add_argument("work")
    ap.add_argument("--schemas", type=int, default=200)
    ap.add_argument("--cache", default="64M")
    ap.add_argument("--same-schema", action="store_true", help="the baseline: one schema, distinct prompts")
    ap.add_argument("--report")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tiny = tiny_model(args.cedar, args.work, 5)
    server = Server(args.cedar, ["-m", tiny, "--grammar-cache", args.cache], os.path.join(args.work, "serve.log"))
    bad, lines = 0, []
    try:
        port, pid = server.port, server.proc.pid
        status, _, _ = post(port, body(-1))
        bad += status != 200
        before = rss(pid)
        peak = before
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for status, _, _ in pool.map(lambda i: post(port, body(i, args.same_schema)), range(args.schemas)):
                bad += status != 200
                peak = max(peak, rss(pid))
        after = rss(pid)
        mib = 1 << 20
        what = "prompts with one schema" if args.same_schema else "distinct schemas"
        lines.append(f"{args.schemas} {what}, --grammar-cache {args.cache}: VmRSS {before / mib:.1f} MiB "
                     f"after warm-up -> {after / mib:.1f} MiB after (peak {peak / mib:.1f} MiB); "
                     f"{bad} requests not 200")
    finally:
        server.stop()
    print_report(lines, args.report)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
