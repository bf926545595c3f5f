#!/usr/bin/env bash
# Retrains cedar-mini from scratch and exports it to models/cedar-mini (docs/CEDAR_MINI.md):
#   tools/train/run.sh [RUN_DIR]      # default RUN_DIR: build-train/run
# Steps: the pinned venv, the V4.1 tokenizer as make-tiny ships it, train.py (recipe.json, about
# an hour on 2 cores), export.py, check_export.py (torch vs the numpy reference), the goldens.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUN=${1:-$ROOT/build-train/run}
CEDAR=${CEDAR:-$ROOT/build/tools/cli/cedar}
"$ROOT/tools/train/setup_venv.sh"
PY=$ROOT/.venv-train/bin/python
[ -x "$CEDAR" ] || "$ROOT/scripts/build.sh"
TOK=$ROOT/build-train/tokenizer
"$CEDAR" make-tiny --out "$TOK" --seed 0 >/dev/null   # ships tokenizer.json with the V4.1 markers
mkdir -p "$RUN"
"$PY" "$ROOT/tools/train/train.py" --tokenizer "$TOK/tokenizer.json" --out "$RUN"
"$PY" "$ROOT/tools/train/export.py" --run "$RUN" --tokenizer-dir "$TOK" --out "$ROOT/models/cedar-mini"
cp "$RUN/train_log.jsonl" "$ROOT/models/cedar-mini/train_log.jsonl"
cp "$ROOT/tools/train/recipe.json" "$ROOT/models/cedar-mini/recipe.json"
cp "$RUN/corpus.json" "$ROOT/models/cedar-mini/corpus.json"
"$PY" "$ROOT/tools/train/check_export.py" --run "$RUN" --model "$ROOT/models/cedar-mini"
PY=$PY "$ROOT/tools/train/make_mini_goldens.sh"
