#!/usr/bin/env python3
"""Greedy completions of held-out prompts by cedar: for each held-out file of a cedar-mini run
(corpus.json), the prompt is the file's first function definition line and the line after it; cedar
generates the continuation. Prints markdown (prompt, then completion) for the closing note or docs.

    held_out_completions.py [--model models/cedar-mini] [--count 10] [-n 40] [--cedar build/tools/cli/cedar]

Standard library only; files missing on this machine are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def prompt_of(text: str) -> str | None:
    """The first `def` line at any indentation and the line after it."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("def ") and i + 1 < len(lines):
            return "".join(lines[i: i + 2])
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "cedar-mini"))
    ap.add_argument("--cedar", default=os.path.join(ROOT, "build", "tools", "cli", "cedar"))
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("-n", type=int, default=40, help="tokens to generate")
    args = ap.parse_args(argv)
    with open(os.path.join(args.model, "corpus.json")) as f:
        held = json.load(f)["held_out_files"]
    shown = 0
    for path in held:
        if shown == args.count:
            break
        try:
            with open(path, encoding="utf-8") as f:
                prompt = prompt_of(f.read())
        except OSError:
            continue
        if not prompt:
            continue
        out = subprocess.run([args.cedar, "generate", "-m", args.model, "-p", prompt, "-n", str(args.n)],
                             check=True, capture_output=True, text=True).stdout
        print(f"**{os.path.basename(path)}**\n\n```python\n{prompt}\u2502{out}\n```\n")
        shown += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
