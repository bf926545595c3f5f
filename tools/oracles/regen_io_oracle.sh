#!/usr/bin/env bash
# Refreshes the committed safetensors oracle files in tests/io/data/ from the reference Python
# implementation (pinned in tools/oracles/requirements-io.txt, venv in .venv-io). Run from the repo
# root after changing the sample in tests/io/writer_test.cc or the oracle script:
#   tools/oracles/regen_io_oracle.sh [build-dir]
set -euo pipefail
BUILD=${1:-build}
VENV=.venv-io
DATA=tests/io/data
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r tools/oracles/requirements-io.txt
fi
PY="$VENV/bin/python tools/oracles/safetensors_oracle.py"
mkdir -p "$DATA"
# The reference writes its file; the reference reads it back.
$PY write "$DATA/python_written.safetensors"
$PY list "$DATA/python_written.safetensors" > "$DATA/python_written.listing.txt"
# cedar's writer writes its file (the test does this on every run); the reference reads it.
cmake --build "$BUILD" --target test_io
"$BUILD/tests/io/test_io" --gtest_filter='PythonOracle.ReferenceReadsWhatTheWriterWrites' >/dev/null || true
cp "$BUILD/tests/io/cedar_written.safetensors" "$DATA/cedar_written.safetensors"
$PY list "$DATA/cedar_written.safetensors" > "$DATA/cedar_written.listing.txt"
echo "refreshed $DATA: python_written.{safetensors,listing.txt} cedar_written.{safetensors,listing.txt}"
