#!/usr/bin/env python3
"""The shared KV tier (--kv-tier redis://...) on real components: a redis-server of the test's own on
a loopback port and `cedar serve` replicas on one tiny random checkpoint.

  kv_tier_test.py PATH/TO/cedar [WORK_DIR]

A conversation's first turn runs on replica A, its second on replica B: B restores A's prefix from
Redis (every prompt token of turn 1: whole blocks and the tail), computes only the new tokens and one
replayed window, and answers exactly what a server that has turn 1 in its own memory answers (R, no
tier). Restarted replicas with empty local caches still hit, and every API reports the cached tokens
in its own usage field. Exits 77 (skipped) where redis-server is not installed.
"""
import os
import sys

from kv_tier_util import Redis, Server, check, finish, prepare, tiny_model, turn1, turn2


def level_tokens(server, level):
    return server.metrics().get(f'cedar_prefix_cache_tokens_total{{level="{level}"}}', 0)


def main():
    cedar, work = prepare(sys.argv, "cedar_kv_tier_")
    tiny = tiny_model(cedar, work, "tiny", 3)
    # Redis wants a password: A reads it from a file, B from the environment (never the command line).
    redis = Redis(work, password="kv-tier-test-secret")
    password_file = os.path.join(work, "redis.password")
    with open(password_file, "w") as f:
        f.write(redis.password + "\n")
    tier = ["--kv-tier", f"redis://127.0.0.1:{redis.port}"]
    tier_a = tier + ["--kv-tier-password-file", password_file]
    env_b = {"CEDAR_KV_TIER_PASSWORD": redis.password}
    a = Server(cedar, tiny, work, "a", tier_a)
    b = Server(cedar, tiny, work, "b", tier, env_b)
    ref = Server(cedar, tiny, work, "ref")  # no tier: its turn 2 is a local (memory) hit
    try:
        first = turn1("the replicas")
        written = a.write_count()
        answer_a, u1 = a.chat(first, 24)
        a.wait_written(written)
        answer_ref, _ = ref.chat(first, 24)
        check("turn 1 is deterministic across servers", answer_a == answer_ref)
        keys = redis.keys()
        check("A stored its prefix in Redis", len(keys) > 0, f"{len(keys)} keys")
        check("the password never shows in a replica's log",
              all(redis.password not in open(s.log_path).read() for s in (a, b)))

        second = turn2(first, answer_a)
        before = b.metrics()
        evals_before = redis.calls("eval")
        answer_b, u2 = b.chat(second, 16)
        evals = redis.calls("eval") - evals_before
        after = b.metrics()
        answer_local, u_local = ref.chat(second, 16)
        p1, p2 = u1["prompt_tokens"], u2["prompt_tokens"]
        cached = u2["prompt_tokens_details"]["cached_tokens"]
        computed = after['cedar_engine_tokens_total{kind="computed_prompt"}'] - \
            before['cedar_engine_tokens_total{kind="computed_prompt"}']
        replayed = after['cedar_engine_tokens_total{kind="replayed"}'] - before['cedar_engine_tokens_total{kind="replayed"}']
        from_redis = after['cedar_prefix_cache_tokens_total{level="redis"}'] - \
            before['cedar_prefix_cache_tokens_total{level="redis"}']
        print(f"turn 1: {p1} prompt tokens on A; turn 2 on B: {p2} prompt tokens, {cached} cached "
              f"({from_redis:.0f} from Redis), {replayed:.0f} replayed, {computed:.0f} computed; "
              f"local hit on the reference: {u_local['prompt_tokens_details']['cached_tokens']} cached")
        check("B reuses every prompt token of A's turn 1", cached >= p1, f"cached {cached}, turn-1 prompt {p1}")
        check("B's cached tokens came from Redis", from_redis == cached, f"{from_redis:.0f} of {cached}")
        check("B computes only the new turn and the replay window", computed == p2 - cached + replayed,
              f"{computed:.0f} == {p2} - {cached} + {replayed:.0f}")
        check("the replay is at most one window", 0 < replayed <= 16 + 1, f"{replayed:.0f}")
        check("B restores what a local hit restores", cached == u_local["prompt_tokens_details"]["cached_tokens"])
        check("B answers exactly as a local hit", answer_b == answer_local, f"{answer_b!r} vs {answer_local!r}")
        lookups = after['cedar_kv_tier_events_total{event="lookup"}'] - before['cedar_kv_tier_events_total{event="lookup"}']
        check("B's lookup, blocks and tail, was one round trip (one EVAL)", lookups == 1 and evals == 1,
              f"{lookups:.0f} lookups, {evals} EVAL calls")
        check("the hit is counted at the redis level",
              after['cedar_prefix_cache_hits_total{level="redis"}'] - before['cedar_prefix_cache_hits_total{level="redis"}'] == 1)
        b.wait_written(0)

        # Both replicas restart with empty local caches (no --cache-dir): the tier still has turn 2.
        check("A stops cleanly", a.stop() == 0)
        check("B stops cleanly", b.stop() == 0)
        a = Server(cedar, tiny, work, "a2", tier_a)
        b = Server(cedar, tiny, work, "b2", tier, env_b)
        third = second + [{"role": "assistant", "content": answer_b}, {"role": "user", "content": "And the risks?"}]
        _, u3 = a.chat(third, 8)
        c3 = u3["prompt_tokens_details"]["cached_tokens"]
        check("after a restart the tier still hits", c3 >= p2 and level_tokens(a, "redis") == c3,
              f"cached {c3}, turn-2 prompt {p2}")
        # Each API's own usage field reports the cached tokens (fresh replica B2: a tier hit each time).
        r = b.post("/v1/responses", {"model": "m", "input": second, "max_output_tokens": 4, "temperature": 0})
        c_resp = r["usage"]["input_tokens_details"]["cached_tokens"]
        check("Responses: usage.input_tokens_details.cached_tokens", c_resp >= p1, f"{c_resp}")
        m = b.post("/v1/messages", {"model": "m", "system": first[0]["content"], "messages": third[1:],
                                    "max_tokens": 4, "temperature": 0})
        c_msg = m["usage"]["cache_read_input_tokens"]
        check("Messages: usage.cache_read_input_tokens", c_msg >= p1, f"{c_msg}")
        written = b.write_count()
        b.post("/v1/completions", {"model": "m", "prompt": SYSTEM_TEXT * 3, "max_tokens": 2, "temperature": 0})
        b.wait_written(written)
        c2 = a.post("/v1/completions", {"model": "m", "prompt": SYSTEM_TEXT * 3 + " More.", "max_tokens": 2,
                                        "temperature": 0})
        check("Completions: usage.prompt_tokens_details.cached_tokens",
              c2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0,
              f"{c2['usage']['prompt_tokens_details']['cached_tokens']}")
    finally:
        for s in (a, b, ref):
            if s.proc.poll() is None:
                s.stop()
        redis.stop()
    return finish(work)


SYSTEM_TEXT = "A replica computes a long shared document once, and the others read it from the tier. " * 4

if __name__ == "__main__":
    sys.exit(main())
