#!/usr/bin/env python3
"""Load driver for a running `cedar serve` (standard library only): N clients stream requests back
to back for a fixed time; reports completed streams, failures, aggregate output tokens/s, and the
server's resident memory over the run (when its pid is given).

  python3 load_client.py --url http://127.0.0.1:8000 --clients 16 --seconds 120 --pid 1234

Every stream must end properly ([DONE] after a finish reason, usage present); anything else is a
failure and the first few are printed. Used for the issue's 2-minute run on the tiny checkpoint
(docs/SERVER.md); the CTest load test (test_serve Load.*) is the in-process, bounded version.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def one_stream(host, port, api, n, max_tokens, key):
    if api == "chat":
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": f"request {n}: say something"}], "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}
    else:
        path = "/v1/completions"
        body = {"prompt": f"Request {n}: once upon a time", "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection(host, port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    conn.request("POST", path, json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        return None, f"status {resp.status}: {resp.read()[:300]!r}"
    tokens, finish, done = None, None, False
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            return None, "error event: " + json.dumps(chunk["error"])[:300]
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
    conn.close()
    if not done or finish is None or tokens is None:
        return None, f"incomplete stream (done={done}, finish={finish}, usage={tokens})"
    return tokens, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--api", choices=["completions", "chat"], default="completions")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pid", type=int, default=0, help="server pid, to sample its RSS")
    ap.add_argument("--key", default="")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    lock = threading.Lock()
    stats = {"streams": 0, "tokens": 0, "failures": 0, "errors": []}
    deadline = time.monotonic() + args.seconds

    def client(c):
        n = 0
        while time.monotonic() < deadline:
            try:
                tokens, error = one_stream(u.hostname, u.port, args.api, c * 100000 + n, args.max_tokens, args.key)
            except Exception as e:  # a dropped connection is a failure, not the end of the run
                tokens, error = None, repr(e)
            with lock:
                if error:
                    stats["failures"] += 1
                    if len(stats["errors"]) < 5:
                        stats["errors"].append(error)
                else:
                    stats["streams"] += 1
                    stats["tokens"] += tokens
            n += 1

    rss = [rss_kib(args.pid)] if args.pid else []
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if args.pid:
            rss.append(rss_kib(args.pid))
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    rss = [r for r in rss if r is not None]
    print(f"{args.clients} clients x {args.seconds:.0f} s ({args.api}, max_tokens {args.max_tokens}): "
          f"{stats['streams']} streams complete, {stats['failures']} failures, "
          f"{stats['tokens']} tokens, {stats['tokens'] / elapsed:.1f} tokens/s"
          + (f"; server RSS {rss[0]} -> max {max(rss)} -> {rss[-1]} KiB" if rss else ""))
    for e in stats["errors"]:
        print("  failure:", e)
    return 1 if stats["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
