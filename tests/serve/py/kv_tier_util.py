"""Helpers of the shared KV tier tests (kv_tier_test.py): a private redis-server, cedar serve
replicas, /metrics, the conversations. Standard library only; Redis is driven with redis-cli."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

FAILURES = []
SKIP = 77  # CTest SKIP_RETURN_CODE


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        FAILURES.append(name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(cedar, work, name, seed):
    """A random tiny checkpoint (`cedar make-tiny`); two seeds are two different models."""
    path = os.path.join(work, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([cedar, "make-tiny", "--out", path, "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return path


class Redis:
    """A redis-server of the test's own on a loopback port, in a temporary directory, no persistence."""

    def __init__(self, work, port=None, password=None):
        self.work, self.port, self.password = work, port or free_port(), password
        self.start()

    @staticmethod
    def available():
        return shutil.which("redis-server") and shutil.which("redis-cli")

    def start(self):
        self.log = open(os.path.join(self.work, "redis.log"), "a")
        self.proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--dir", self.work] +
                                     (["--requirepass", self.password] if self.password else []),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if self.proc.poll() is None and self.cli("PING", check=False) == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start: " + open(os.path.join(self.work, "redis.log")).read()[-2000:])

    def cli(self, *args, check=True):
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port)] + auth + list(args),
                           capture_output=True, encoding="utf-8", errors="replace", timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {args}: {r.stderr}")
        return r.stdout.strip()

    def calls(self, command):
        """Calls of `command` the server has answered (INFO commandstats)."""
        for line in self.cli("INFO", "commandstats").splitlines():
            if line.startswith(f"cmdstat_{command}:"):
                return int(line.split("calls=")[1].split(",")[0])
        return 0

    def corrupt(self, key, offset, text):
        """Overwrites bytes of a stored value, a string or every field of a hash (the tails)."""
        self.cli("EVAL", "if redis.call('TYPE', KEYS[1]).ok == 'hash' then "
                 "for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do local v = redis.call('HGET', KEYS[1], f); "
                 "redis.call('HSET', KEYS[1], f, string.sub(v, 1, ARGV[1]) .. ARGV[2] .. "
                 "string.sub(v, ARGV[1] + #ARGV[2] + 1)) end else redis.call('SETRANGE', KEYS[1], ARGV[1], ARGV[2]) "
                 "end return 1", "1", key, str(offset), text)

    def keys(self, pattern="cedar:kv:*"):
        out = self.cli("--scan", "--pattern", pattern)
        return [k for k in out.splitlines() if k]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


class Server:
    """`cedar serve` on a free loopback port (the server picks it: --port 0)."""

    def __init__(self, cedar, model, work, name, extra=(), env=None):
        self.log_path = os.path.join(work, name + ".log")
        self.log = open(self.log_path, "w")
        args = [cedar, "serve", "-m", model, "--port", "0", "--threads", "1", "--parallel", "2", "--thinking", "off"]
        self.proc = subprocess.Popen(args + list(extra), stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        self.port = None
        for _ in range(1200):
            if self.proc.poll() is not None:
                break
            m = re.search(r"http://127\.0\.0\.1:(\d+)", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if self.port is None:
            raise RuntimeError(f"server {name} did not start:\n" + open(self.log_path).read())

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{path} returned {resp.status}: {data[:400]!r}")
        return json.loads(data)

    def chat(self, messages, max_tokens):
        """(answer text, usage) of a greedy chat completion."""
        r = self.post("/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": max_tokens,
                                               "temperature": 0})
        return r["choices"][0]["message"]["content"], r["usage"]

    def chat_stream(self, messages, max_tokens, after_first_chunk):
        """Streams a chat completion, calls after_first_chunk() once the first token has arrived, reads the
        rest; returns (text, finish_reason)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", "/v1/chat/completions",
                     json.dumps({"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                 "stream": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"stream returned {resp.status}: {resp.read()[:400]!r}")
        text, finish, called = "", None, False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
                finish = choice.get("finish_reason") or finish
                if not called and text:
                    called = True
                    after_first_chunk()
        conn.close()
        return text, finish

    def metrics(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        data = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for line in data.splitlines():
            m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def tier(self, event):
        return self.metrics().get(f'cedar_kv_tier_events_total{{event="{event}"}}', 0)

    def write_count(self):
        """Records the tier's writer has finished with (sent or dropped)."""
        return self.tier("written") + self.tier("dropped_write")

    def wait_written(self, before):
        """Waits (bounded) until the writer has finished more records than `before` (a write_count())
        and is idle."""
        for _ in range(400):
            m = self.metrics()
            done = m.get('cedar_kv_tier_events_total{event="written"}', 0) + \
                m.get('cedar_kv_tier_events_total{event="dropped_write"}', 0)
            if done > before and m.get('cedar_kv_tier_write_queue{unit="records"}', 0) == 0:
                return m.get('cedar_kv_tier_events_total{event="written"}', 0)
            time.sleep(0.05)
        raise RuntimeError("the tier's writer did not finish")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # busy past any sane shutdown: not a clean stop
            self.proc.kill()
            code = self.proc.wait(timeout=60)
        self.log.close()
        return code


SYSTEM = ("You are a careful assistant for a self-hosted DeepSeek-V4.1 server that several replicas share. " * 10).strip()


def turn1(topic):
    # The topic leads, so conversations share no block: each one's cache is its own.
    return [{"role": "system", "content": f"Topic: {topic}. " + SYSTEM},
            {"role": "user", "content": f"Summarise the plan for {topic}."}]


def turn2(first, answer):
    return first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now list the three steps."}]


def finish(work):
    if not FAILURES:
        shutil.rmtree(work, ignore_errors=True)
        print("all checks passed")
        return 0
    print("FAILED: " + ", ".join(FAILURES))
    return 1


def prepare(argv, prefix):
    if not Redis.available():
        print("SKIP: redis-server / redis-cli are not installed (scripts/deps.sh installs redis-server)")
        sys.exit(SKIP)
    cedar = argv[1]
    work = argv[2] if len(argv) > 2 else None
    if not work:
        import tempfile
        work = tempfile.mkdtemp(prefix=prefix)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return cedar, work
