#!/usr/bin/env bash
# The main job on an embedded default: install dependencies, build, write a tiny random-weight
# checkpoint in the released DeepSeek-V4.1 layout, show its layer plan and generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
BIN=${CEDAR_BUILD_DIR:-build}/tools/cli/cedar
DIR=${CEDAR_DEMO_DIR:-${CEDAR_BUILD_DIR:-build}/tiny}
"$BIN" make-tiny --out "$DIR" --seed 0
"$BIN" inspect -m "$DIR" | head -n 60
echo
echo "== cedar generate (random weights: the text is noise; the numerics are the reference's) =="
"$BIN" generate -m "$DIR" -p "The quick brown fox" -n 24
"$BIN" kv-report --config configs/deepseek-v4.1-flash.json
