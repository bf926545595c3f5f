#!/usr/bin/env bash
# Refreshes the committed Engram oracle files in tests/model/data/ (run from the repo root):
#   engram_numpy_oracle.json  real numpy (pinned in requirements-engram.txt, venv .venv-engram):
#                             SeedSequence / PCG64 / Generator.integers / hash multipliers
#   engram_hash_oracle.json   plain-Python restatement of engram.py NgramHashState (no dependencies)
set -euo pipefail
VENV=.venv-engram
DATA=tests/model/data
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r tools/oracles/requirements-engram.txt
fi
mkdir -p "$DATA"
"$VENV/bin/python" tools/oracles/engram_multipliers.py > "$DATA/engram_numpy_oracle.json"
python3 tools/oracles/engram_hash_oracle.py > "$DATA/engram_hash_oracle.json"
echo "refreshed $DATA/engram_numpy_oracle.json and $DATA/engram_hash_oracle.json"
