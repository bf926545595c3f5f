#!/usr/bin/env bash
# The main job: install dependencies, build cedar, and complete a Python prompt with cedar-mini
# (models/cedar-mini: a DeepSeek-V4.1 model trained at small scale on Python sources, committed in
# the released checkpoint layout; docs/CEDAR_MINI.md). The completion streams as it is generated.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
CEDAR_BUILD_TARGETS=cedar scripts/build.sh  # the binary alone; scripts/test.sh builds the rest
BIN=${CEDAR_BUILD_DIR:-build}/tools/cli/cedar
MODEL=${CEDAR_DEMO_MODEL:-models/cedar-mini}
PROMPT=${CEDAR_DEMO_PROMPT:-$'def is_even(n):\n    return n % 2 == 0\n\n\ndef is_odd(n):\n'}
"$BIN" inspect -m "$MODEL" | head -n 24
echo
echo "== cedar generate -m $MODEL (greedy, 64 tokens) =="
printf '%s' "$PROMPT"
"$BIN" generate -m "$MODEL" -p "$PROMPT" -n 64
echo
