#!/usr/bin/env python3
"""Issue 35 point 6 probe (a figure for the note, not a CTest test): 100 clients each send the header
of a 15 MB body and half of it, then wait. Prints how many the server holds, how many it refused with
503 (--max-body-bytes-in-flight), and its RSS before and after. Loopback only, standard library only.
  python3 tests/serve/py/body_budget_probe.py build/tools/cli/cedar 18091 [extra cedar serve flags]
  (e.g. --max-body-bytes-in-flight 0 for the server without the budget)
Run from the repository root (it serves tests/serve/py/sdk_script.json with the test tokenizer)."""
import socket, subprocess, time, sys, select
cedar, port = sys.argv[1], int(sys.argv[2])
srv = subprocess.Popen([cedar, "serve", "--port", str(port), "--scripted", "tests/serve/py/sdk_script.json",
                        "--tokenizer", "tests/serve/data/tokenizer"] + sys.argv[3:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2)
def rss():
    for line in open(f"/proc/{srv.pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) // 1024
base = rss()
CL = 15 << 20
head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {CL}\r\n\r\n").encode()
half = b" " * (CL // 2)
socks, refused, held = [], 0, 0
for i in range(100):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(head)
    s.setblocking(False)
    sent = 0
    deadline = time.time() + 5
    while sent < len(half) and time.time() < deadline:
        r, w, _ = select.select([s], [s], [], 1)
        if r: break
        if w:
            try: sent += s.send(half[sent:sent + (1 << 20)])
            except BlockingIOError: pass
            except OSError: break
    s.setblocking(True); s.settimeout(0.5)
    try:
        data = s.recv(200)
        if b" 503 " in data: refused += 1
    except socket.timeout:
        held += 1
    socks.append(s)
time.sleep(1)
print(f"{sys.argv[3:]}: 100 half-sent 15 MB bodies: {held} held, {refused} refused with 503; server RSS {base} MB -> {rss()} MB")
srv.terminate(); srv.wait()
