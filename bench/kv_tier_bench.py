#!/usr/bin/env python3
"""Measures the shared KV tier (--kv-tier): a conversation's second turn on another replica.

  bench/kv_tier_bench.py CEDAR NAME=MODEL_DIR [NAME=MODEL_DIR ...] [--contexts 2048 8192 32768]
                         [--threads 2] [--out REPORT.md]

For every model and context length: a private redis-server; replica A (tier) runs turn 1 (a system
prompt of about CONTEXT tokens + a question, 16 answer tokens); then turn 2 (+ the answer + a new
question) runs three ways, each timed as a request for one token (its latency is the time to first
token, TTFT):
  local : on A, whose memory holds turn 1 (a local hit; its question differs from B's so that
          neither turn 2 extends the other's saved blocks)
  tier  : on replica B (tier, empty local cache): the prefix comes from Redis
  cold  : on replica C (no tier, no cache): a cold prefill
and prints, per row: prompt tokens, cached and computed prompt tokens (/metrics), TTFT; Redis bytes
per cached token (MEMORY USAGE of the block keys / tokens they hold) against the KV geometry's own
figure (`cedar kv-report`); the fetch bandwidth of B's lookup (bytes fetched / lookup seconds, as
the replica sees it: socket, checks and copies). Not a test: it asserts nothing.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve", "py"))
from kv_tier_util import Redis, Server  # noqa: E402

WORDS = ("time people way year work day world life hand part child place case week company system program "
         "question government number night point home water room mother area money story fact month lot right "
         "study book eye job word business issue side kind head house service friend father power hour game line "
         "end member law car city community name president team minute idea body information back parent face "
         "others level office door health person art war history party result change morning reason research "
         "girl guy moment air teacher force education").split()


def system_text(n_words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def geometry_bytes_per_token(cedar, model):
    out = subprocess.run([cedar, "kv-report", "-m", model, "--block-tokens", "128", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)["global_bytes_per_token"]


def timed_chat(server, messages, max_tokens):
    m0 = server.metrics()
    t0 = time.monotonic()
    answer, usage = server.chat(messages, max_tokens)
    seconds = time.monotonic() - t0
    m1 = server.metrics()
    key = 'cedar_engine_tokens_total{kind="computed_prompt"}'
    return answer, usage, seconds, m1.get(key, 0) - m0.get(key, 0), m0, m1


def run_one(cedar, name, model, context, threads, work, cold_run=True):
    redis = Redis(work)
    common = ["--threads", str(threads), "--max-context", str(context + 4096), "--max-prompt-tokens", str(context + 2048)]
    tier = ["--kv-tier", f"redis://127.0.0.1:{redis.port}"]
    a = Server(cedar, model, work, f"{name}_{context}_a", common + tier)
    rows = {}
    try:
        first = [{"role": "system", "content": system_text(context, context)},
                 {"role": "user", "content": "Summarise the document in one line."}]
        written = a.write_count()
        answer, u1, t1, _, _, _ = timed_chat(a, first, 16)
        a.wait_written(written)
        block_keys = redis.keys("cedar:kv:*:b:*")
        block_bytes = sum(int(redis.cli("MEMORY", "USAGE", k, "SAMPLES", "0")) for k in block_keys)
        value_bytes = sum(int(redis.cli("STRLEN", k)) for k in block_keys)
        used_memory = int([line.split(":")[1] for line in redis.cli("INFO", "memory").splitlines()
                           if line.startswith("used_memory:")][0])
        stored_tokens = len(block_keys) * 64  # EngineOptions::kv_block_tokens
        base = first + [{"role": "assistant", "content": answer}]
        _, ul, tl, cl, _, _ = timed_chat(a, base + [{"role": "user", "content": "List the steps."}], 1)
        b = Server(cedar, model, work, f"{name}_{context}_b", common + tier)
        second = base + [{"role": "user", "content": "What are the risks?"}]
        _, ub, tb, cb, m0, m1 = timed_chat(b, second, 1)
        fetched = m1.get('cedar_kv_tier_bytes_total{direction="fetched"}', 0) - \
            m0.get('cedar_kv_tier_bytes_total{direction="fetched"}', 0)
        lookup_s = m1.get("cedar_kv_tier_lookup_seconds_total", 0) - m0.get("cedar_kv_tier_lookup_seconds_total", 0)
        b.stop()
        a.stop()
        if cold_run:
            c = Server(cedar, model, work, f"{name}_{context}_c", common)
            _, uc, tc, cc, _, _ = timed_chat(c, second, 1)
            c.stop()
        else:  # turn 1 on A stands in: a cold prefill of nearly the same prompt (and 16 decode steps)
            uc, tc, cc = {"prompt_tokens": u1["prompt_tokens"], "prompt_tokens_details": {"cached_tokens": 0}}, t1, \
                u1["prompt_tokens"]
        rows = {
            "model": name, "context": context, "turn1_prompt": u1["prompt_tokens"], "turn1_s": t1,
            "local": (ul["prompt_tokens"], ul["prompt_tokens_details"]["cached_tokens"], cl, tl),
            "tier": (ub["prompt_tokens"], ub["prompt_tokens_details"]["cached_tokens"], cb, tb),
            "cold": (uc["prompt_tokens"], uc["prompt_tokens_details"]["cached_tokens"], cc, tc),
            "block_keys": len(block_keys), "stored_tokens": stored_tokens,
            "redis_bytes_per_token": block_bytes / stored_tokens if stored_tokens else 0,
            "value_bytes_per_token": value_bytes / stored_tokens if stored_tokens else 0,
            "used_memory": used_memory,
            "geometry_bytes_per_token": geometry_bytes_per_token(cedar, model),
            "fetched_bytes": fetched, "lookup_s": lookup_s,
        }
    finally:
        for s in ("a", "b", "c"):
            srv = locals().get(s)
            if srv is not None and srv.proc.poll() is None:
                srv.stop()
        redis.stop()
    return rows


def report(rows):
    lines = ["| model | context | path | prompt tok | cached | computed | TTFT s |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        for path in ("cold", "tier", "local"):
            p, cached, computed, t = r[path]
            lines.append(f"| {r['model']} | {r['context']} | {path} | {p} | {cached} | {computed:.0f} | {t:.2f} |")
    lines += ["", "| model | context | block keys | tokens in blocks | Redis B/token (MEMORY USAGE) | value B/token | "
              "geometry B/token | overhead | fetched MB | lookup s | fetch MB/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = r["geometry_bytes_per_token"]
        over = (r["redis_bytes_per_token"] / g - 1) * 100 if g else 0
        bw = r["fetched_bytes"] / r["lookup_s"] / 1e6 if r["lookup_s"] else 0
        lines.append(f"| {r['model']} | {r['context']} | {r['block_keys']} | {r['stored_tokens']} | "
                     f"{r['redis_bytes_per_token']:.1f} | {r['value_bytes_per_token']:.1f} | {g:.1f} | {over:.1f} % | "
                     f"{r['fetched_bytes'] / 1e6:.2f} | {r['lookup_s']:.4f} | {bw:.0f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cedar")
    ap.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-cold", action="store_true",
                    help="report turn 1 on A (cold, 16 output tokens) as the cold row instead of a second cold prefill")
    args = ap.parse_args()
    if not Redis.available():
        sys.exit("redis-server / redis-cli are not installed (scripts/deps.sh)")
    rows = []
    for spec in args.models:
        name, model = spec.split("=", 1)
        for context in args.contexts:
            work = tempfile.mkdtemp(prefix="cedar_kv_tier_bench_")
            try:
                rows.append(run_one(args.cedar, name, model, context, args.threads, work, not args.no_cold))
                print(report(rows[-1:]), flush=True)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    text = report(rows)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
