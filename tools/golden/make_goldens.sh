#!/usr/bin/env bash
# Regenerates the committed golden outputs under tests/model/data/golden/ from tiny checkpoints
# written by `cedar make-tiny`, with the independent Python reference (tools/golden/).
#
#   tools/golden/make_goldens.sh                 # write tests/model/data/golden/*.json
#   tools/golden/make_goldens.sh --check         # regenerate into a temp dir and diff with the committed files
#   tools/golden/make_goldens.sh --python-tiny   # self-test: checkpoints from tools/golden/make_tiny_checkpoint.py,
#                                                # output under build-golden/ (never committed)
#   --no-sensitivity                             # skip sensitivity.py (stable_prefix in the manifest)
#
# Environment: CEDAR (default build/tools/cli/cedar), PY (default .venv-golden/bin/python),
# SEEDS (default "1 2 3"), MAX_NEW_TOKENS (default 8), WORK (checkpoints, default build-golden/goldens),
# TOKENIZER_DIR (default: make-tiny's own default, the repository's data/tokenizers/deepseek-v4).
# The venv: python3 -m venv .venv-golden && .venv-golden/bin/pip install -r tools/golden/requirements.txt
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CEDAR=${CEDAR:-$ROOT/build/tools/cli/cedar}
PY=${PY:-$ROOT/.venv-golden/bin/python}
SEEDS=${SEEDS:-"1 2 3"}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-8}
WORK=${WORK:-$ROOT/build-golden/goldens}
TOKENIZER_DIR=${TOKENIZER_DIR:-}
GOLDEN_DIR=$ROOT/tests/model/data/golden
DSPARK_DIR=$ROOT/tests/model/data/golden-dspark  # the draft forward (reference_dspark.py, docs/DSPARK.md)
DSPARK_STEPS=${DSPARK_STEPS:-3}
MODE=write
GENERATOR=cedar
SENSITIVITY=1

for arg in "$@"; do
  case "$arg" in
    --check) MODE=check ;;
    --python-tiny) GENERATOR=python ;;
    --no-sensitivity) SENSITIVITY=0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "make_goldens.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

if [ ! -x "$PY" ]; then
  echo "make_goldens.sh: no Python venv at $PY; create it with:" >&2
  echo "  python3 -m venv $ROOT/.venv-golden && $ROOT/.venv-golden/bin/pip install -r $ROOT/tools/golden/requirements.txt" >&2
  exit 1
fi
if [ "$GENERATOR" = cedar ]; then
  if ! "$CEDAR" make-tiny --help >/dev/null 2>&1; then
    echo "make_goldens.sh: $CEDAR has no 'make-tiny' command; build the cedar target or set CEDAR=" >&2
    exit 1
  fi
fi

OUT=$GOLDEN_DIR
DSPARK_OUT=$DSPARK_DIR
if [ "$MODE" = check ]; then
  SENSITIVITY=0
  OUT=$(mktemp -d)
  DSPARK_OUT=$OUT/dspark
  trap 'rm -rf "$OUT"' EXIT
elif [ "$GENERATOR" = python ]; then
  OUT=$WORK/out-python-tiny
  DSPARK_OUT=$OUT/dspark
fi
mkdir -p "$OUT" "$WORK" "$DSPARK_OUT"
SENS=$WORK/sensitivity-$GENERATOR
rm -rf "$SENS"
mkdir -p "$SENS"

make_checkpoint() {  # seed dir
  rm -rf "$2"
  if [ "$GENERATOR" = cedar ]; then
    local tok=()
    if [ -n "$TOKENIZER_DIR" ]; then tok=(--tokenizer "$TOKENIZER_DIR"); fi
    "$CEDAR" make-tiny --out "$2" --seed "$1" "${tok[@]}" >/dev/null
  else
    "$PY" "$ROOT/tools/golden/make_tiny_checkpoint.py" --out "$2" --seed "$1" \
      --tokenizer-dir "${TOKENIZER_DIR:-$ROOT/data/tokenizers/deepseek-v4}"
  fi
}

PROMPTS=$ROOT/tools/golden/prompts.json
TEXT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$PROMPTS")
mapfile -t PROMPT_SPECS < <("$PY" -c '
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    print(p["name"], p["len"])' "$PROMPTS")

for seed in $SEEDS; do
  ckpt=$WORK/tiny-$GENERATOR-s$seed
  echo "== seed $seed: checkpoint $ckpt"
  make_checkpoint "$seed" "$ckpt"
  for spec in "${PROMPT_SPECS[@]}"; do
    read -r name len <<<"$spec"
    for keys in reference owner; do
      file=$OUT/tiny-s$seed-$name-$keys.json
      "$PY" "$ROOT/tools/golden/reference_forward.py" --checkpoint "$ckpt" --prompt-text "$TEXT" --prompt-len "$len" \
        --max-new-tokens "$MAX_NEW_TOKENS" --index-keys "$keys" --out "$file"
      echo "   $(basename "$file")"
      if [ "$SENSITIVITY" = 1 ]; then
        "$PY" "$ROOT/tools/golden/sensitivity.py" --golden "$file" --checkpoint "$ckpt" --out "$SENS/$(basename "$file")"
      fi
    done
    dfile=$DSPARK_OUT/dspark-s$seed-$name.json
    "$PY" "$ROOT/tools/golden/reference_dspark.py" --checkpoint "$ckpt" --prompt-text "$TEXT" --prompt-len "$len" \
      --decode-steps "$DSPARK_STEPS" --out "$dfile"
    echo "   dspark/$(basename "$dfile")"
  done
done

# The vision tower's golden (tools/golden/vision_reference.py), after the backbone's: its checkpoint
# is seed 1 with `--vision`, whose backbone tensors are seed 1's own (every tensor is drawn from its
# seed and name), so the text goldens above are untouched by it.
if [ "$GENERATOR" = cedar ]; then
  vckpt=$WORK/tiny-vision-s1
  rm -rf "$vckpt"
  vtok=()
  if [ -n "$TOKENIZER_DIR" ]; then vtok=(--tokenizer "$TOKENIZER_DIR"); fi
  "$CEDAR" make-tiny --out "$vckpt" --seed 1 --vision "${vtok[@]}" >/dev/null
  "$PY" "$ROOT/tools/golden/vision_reference.py" "$vckpt" "$OUT/vision-tiny-s1.json"
  echo "   vision-tiny-s1.json"
  # A prompt with two images of different sizes and aspect ratios (5x8 and 7x4 patch grids: 2x3 and
  # 3x2 tokens), greedy ids and logits (tests/model/vision_test.cc, GreedyIdsOfAPromptWithTwoImages...).
  "$PY" "$ROOT/tools/golden/reference_forward.py" --checkpoint "$vckpt" \
    --prompt-ids 0,1000,2000,3000,129264,4000,5000,129264,6000,7000,8000,9000 \
    --image-grid 5,8,1 --image-grid 7,4,2 --max-new-tokens 6 --out "$OUT/vision-generate-s1.json"
  echo "   vision-generate-s1.json"
fi

"$PY" - "$OUT" "$GENERATOR" "$SENS" <<'EOF'
import json, os, sys
out, generator, sens = sys.argv[1], sys.argv[2], sys.argv[3]
runs = []
for name in sorted(os.listdir(out)):
    if not name.startswith("tiny-s") or not name.endswith(".json"):
        continue
    with open(os.path.join(out, name)) as f:
        g = json.load(f)
    runs.append({"file": name, "seed": int(name.split("-")[1][1:]), "index_keys": g["index_keys"],
                 "prompt_len": len(g["prompt_ids"]), "greedy_ids": g["greedy_ids"], "stop_reason": g["stop_reason"],
                 "ties": g["ties"],
                 "weights_sha256": g["checkpoint"]["weights_sha256"]})
    sens_file = os.path.join(sens, name)
    if os.path.exists(sens_file):
        with open(sens_file) as f:
            s = json.load(f)
        runs[-1]["stable_prefix"] = s["stable_prefix"]
        runs[-1]["sensitivity"] = {k: {"first_diverging_step": v["first_diverging_step"],
                                       "step0_max_abs_logit_diff": v["step0_max_abs_logit_diff"]}
                                   for k, v in s["variants"].items()}
manifest = {"format": "cedar-golden-manifest-v1", "checkpoint_generator": generator,
            "make_checkpoint": "cedar make-tiny --out DIR --seed SEED" if generator == "cedar"
            else "tools/golden/make_tiny_checkpoint.py --out DIR --seed SEED",
            "tolerance": "docs/NUMERICS.md", "differences": "docs/GOLDEN.md",
            "stable_prefix": "leading greedy ids that survive last-ulp implementation changes (tools/golden/sensitivity.py)",
            "runs": runs}
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
EOF

if [ "$MODE" = check ]; then
  status=0
  for f in "$OUT"/tiny-*.json "$OUT"/vision-*.json; do
    cmp -s "$f" "$GOLDEN_DIR/$(basename "$f")" || { echo "differs: $(basename "$f")" >&2; status=1; }
  done
  for f in "$GOLDEN_DIR"/tiny-*.json "$GOLDEN_DIR"/vision-*.json; do
    [ -e "$OUT/$(basename "$f")" ] || { echo "not regenerated: $(basename "$f")" >&2; status=1; }
  done
  for f in "$DSPARK_OUT"/dspark-*.json; do
    cmp -s "$f" "$DSPARK_DIR/$(basename "$f")" || { echo "differs: dspark/$(basename "$f")" >&2; status=1; }
  done
  if [ "$status" = 0 ]; then
    echo "make_goldens.sh: committed goldens reproduce exactly"
  else
    echo "make_goldens.sh: committed goldens differ from a fresh run (see the files above)" >&2
    exit 1
  fi
else
  echo "make_goldens.sh: wrote $(ls "$OUT" | wc -l) files to $OUT"
fi
