#!/usr/bin/env python3
"""Faults of the shared KV tier, on real components (a private redis-server, tiny `cedar serve`
replicas): every request is answered, and answered correctly, while Redis is

  * holding values overwritten with garbage  -> ignored, counted, deleted; the answer is the cold one
  * holding another model's values under this model's keys -> the same
  * killed while a response streams          -> the stream completes; cedar goes on with memory + disk
  * paused with SIGSTOP (slow)               -> the lookup misses its deadline; the answer is the cold one
  * full (maxmemory, noeviction)             -> writes refused with OOM and counted; answers unchanged
and the tier comes back (reconnect with backoff) once Redis does.

  kv_tier_faults_test.py PATH/TO/cedar [WORK_DIR]

Also Redis down when a replica starts (it serves, then joins the tier once Redis is there). The
reference answers come from servers without the tier that have never seen the conversation (a
cold prefill). Exits 77 (skipped) where redis-server is not installed.
"""
import os
import sys
import time

from kv_tier_util import Redis, Server, check, finish, free_port, prepare, tiny_model, turn1, turn2


def wait_up(server, topic_prefix):
    """Sends small cold requests (each looks the tier up) until the replica reports the tier up again;
    bounded. Returns whether it came back."""
    for i in range(60):
        server.chat(turn1(f"{topic_prefix} probe {i}"), 1)
        if server.metrics().get("cedar_kv_tier_up", 0) == 1:
            return True
        time.sleep(0.25)
    return False


def main():
    cedar, work = prepare(sys.argv, "cedar_kv_tier_faults_")
    tiny = tiny_model(cedar, work, "tiny", 3)
    other = tiny_model(cedar, work, "other", 4)
    redis = Redis(work)
    tier = ["--kv-tier", f"redis://127.0.0.1:{redis.port}", "--kv-tier-timeout", "300"]
    a = Server(cedar, tiny, work, "a", tier)
    b = Server(cedar, tiny, work, "b", tier)
    cold = Server(cedar, tiny, work, "cold", ["--replay", "full"])  # never reuses: every answer is a cold one
    servers = [a, b, cold]
    try:
        # 0. Redis down at start: the replica starts, answers, reports the outage, and joins the tier
        # once a Redis appears at the address.
        late_port = free_port()
        late = Server(cedar, tiny, work, "late", ["--kv-tier", f"redis://127.0.0.1:{late_port}",
                                                  "--kv-tier-timeout", "300"])
        servers.append(late)
        got, _ = late.chat(turn1("a tier down at start"), 8)
        want, _ = cold.chat(turn1("a tier down at start"), 8)
        check("down at start: the replica answers, and right", got == want)
        check("down at start: the outage shows in /metrics", late.metrics().get("cedar_kv_tier_up", 1) == 0 and
              late.tier("outage") == 1)
        os.makedirs(os.path.join(work, "late"))
        late_redis = Redis(os.path.join(work, "late"), late_port)
        check("down at start: the replica joins the tier once Redis is there", wait_up(late, "late"))
        late.stop()
        servers.remove(late)
        late_redis.stop()

        # 1. Garbage: every stored value of the conversation is overwritten in the middle.
        first = turn1("garbage")
        written = a.write_count()
        answer, _ = a.chat(first, 16)
        a.wait_written(written)
        keys = redis.keys()
        for k in keys:
            redis.corrupt(k, 120, "garbage!")
        second = turn2(first, answer)
        corrupt = b.tier("corrupt")
        got, usage = b.chat(second, 12)
        want, _ = cold.chat(second, 12)
        check("garbage: the request is answered from a cold prefill", usage["prompt_tokens_details"]["cached_tokens"] == 0,
              f"cached {usage['prompt_tokens_details']['cached_tokens']}")
        check("garbage: the answer is the cold answer", got == want, f"{got!r} vs {want!r}")
        check("garbage: the bad values are counted", b.tier("corrupt") > corrupt)
        left = sum(redis.cli("GETRANGE", k, "120", "127", check=False) == "garbage!" or
                   redis.cli("TYPE", k) == "hash" for k in keys)
        check("garbage: the bad values fetched are deleted", b.tier("deleted") > 0 and left < len(keys),
              f"{b.tier('deleted'):.0f} deleted, {left} of {len(keys)} garbage values left (tails never looked up)")

        # 2. Another model's values under this model's keys (same tokens, other weights).
        earlier = set(redis.keys())
        c = Server(cedar, other, work, "c", tier)
        servers.append(c)
        first = turn1("foreign")
        written = c.write_count()
        answer_c, _ = c.chat(first, 16)
        c.wait_written(written)
        c.stop()
        servers.remove(c)
        theirs = set(redis.keys()) - earlier
        written = a.write_count()
        a.chat(first, 16)
        a.wait_written(written)
        ours = [k for k in redis.keys() if k not in theirs and k not in earlier]
        check("foreign: the two models use separate key spaces", len(ours) > 0 and len(theirs) > 0 and
              {k.split(":")[3] for k in ours}.isdisjoint({k.split(":")[3] for k in theirs}))
        for k in ours:
            redis.cli("COPY", sorted(theirs)[0], k, "REPLACE")
        second = turn2(first, answer_c)
        foreign = b.tier("foreign")
        got, usage = b.chat(second, 12)
        want, _ = cold.chat(second, 12)
        check("foreign: nothing is reused", usage["prompt_tokens_details"]["cached_tokens"] == 0)
        check("foreign: the answer is the cold answer", got == want, f"{got!r} vs {want!r}")
        check("foreign: the values are counted", b.tier("foreign") > foreign)

        # 3. Redis killed while a response streams.
        first = turn1("a killed tier")
        text, reason = a.chat_stream(first, 32, redis.kill)
        check("killed: the stream completes", reason in ("stop", "length") and len(text) > 0, f"{reason}")
        second = turn2(first, text)
        got, usage = b.chat(second, 12)
        want, _ = cold.chat(second, 12)
        check("killed: the next turn elsewhere is answered cold and right", got == want and
              usage["prompt_tokens_details"]["cached_tokens"] == 0)
        check("killed: the outage shows in /metrics", a.metrics().get("cedar_kv_tier_up", 1) == 0 and
              a.tier("outage") >= 1 and b.tier("outage") >= 1)
        again, usage = a.chat(second, 12)
        check("killed: the replica's own memory still hits", usage["prompt_tokens_details"]["cached_tokens"] > 0)
        redis = Redis(work, redis.port)
        check("killed: the replica reconnects once Redis is back", wait_up(b, "reconnect"))

        # 4. Redis paused (SIGSTOP): slow, every reply misses its deadline.
        first = turn1("a paused tier")
        written = a.write_count()
        answer, _ = a.chat(first, 16)
        a.wait_written(written)
        redis.pause()
        errors = b.tier("error")
        second = turn2(first, answer)
        got, usage = b.chat(second, 12)
        want, _ = cold.chat(second, 12)
        check("paused: the request is answered cold and right", got == want and
              usage["prompt_tokens_details"]["cached_tokens"] == 0, f"{got!r} vs {want!r}")
        check("paused: the missed deadline is counted", b.tier("error") > errors)
        redis.resume()
        check("paused: the tier comes back after SIGCONT", wait_up(b, "resume"))
        third = turn1("after the pause")
        written = a.write_count()
        answer, _ = a.chat(third, 16)
        a.wait_written(written)
        _, usage = b.chat(turn2(third, answer), 4)
        check("paused: the replicas share prefixes again", usage["prompt_tokens_details"]["cached_tokens"] > 0)

        # 5. Redis full under noeviction: every write is refused with OOM; reads still work.
        redis.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
        redis.cli("CONFIG", "SET", "maxmemory", "1")
        first = turn1("a full tier")
        refused = a.tier("error_reply")
        written = a.write_count()
        answer, _ = a.chat(first, 16)
        a.wait_written(written)
        check("full: the refused writes are counted", a.tier("error_reply") > refused)
        second = turn2(first, answer)
        got, usage = b.chat(second, 12)
        want, _ = cold.chat(second, 12)
        check("full: the next turn elsewhere is answered cold and right", got == want and
              usage["prompt_tokens_details"]["cached_tokens"] == 0, f"{got!r} vs {want!r}")
        _, usage = a.chat(second, 4)
        check("full: the replica's own memory still hits", usage["prompt_tokens_details"]["cached_tokens"] > 0)
        redis.cli("CONFIG", "SET", "maxmemory", "0")
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.stop()
        redis.stop()
    return finish(work)


if __name__ == "__main__":
    sys.exit(main())
