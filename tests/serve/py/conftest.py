"""Starts `cedar serve --scripted` once per test session on a free loopback port.

The scripted engine (sdk_script.json) plays known completions, DSML tool calls and reasoning
included, through the real prompt encoder, streaming parser and wire formats; the official SDKs
then parse what the server sends. CEDAR_BIN names the cedar binary (run_sdk_tests.sh sets it).
"""
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
API_KEY = "test-key"


@pytest.fixture(scope="session")
def server_url():
    binary = os.environ.get("CEDAR_BIN")
    if not binary:
        pytest.fail("CEDAR_BIN is not set (run through tests/serve/py/run_sdk_tests.sh)")
    cmd = [binary, "serve", "--scripted", os.path.join(HERE, "sdk_script.json"),
           "--tokenizer", os.path.join(HERE, "..", "data", "tokenizer"),
           "--port", "0", "--api-key", API_KEY, "--served-model-name", "cedar-test",
           "--thinking", "off"]  # the script's answers are chat-mode completions (no reasoning first)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in proc.stdout:  # the start-up line names the port
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        pytest.fail("cedar serve did not start: " + (proc.stdout.read() or ""))
    yield url
    proc.terminate()
    try:
        assert proc.wait(timeout=20) == 0, "cedar serve did not exit cleanly on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
