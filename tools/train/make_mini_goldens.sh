#!/usr/bin/env bash
# Writes the cedar-mini goldens (tests/model/data/golden-mini/) with the independent numpy reference
# (tools/golden/reference_forward.py) on the committed checkpoint models/cedar-mini: for each
# held-out prompt of tools/train/mini_prompts.json, prompts of 64 and 97 tokens (past the window of
# 32, the index top-k of 16 and the candidate pool of 8 x 4), 8 greedy tokens, the official
# index-key behaviour and the fixed one. golden_test.cc replays them bit for bit.
#
#   tools/train/make_mini_goldens.sh            # PY defaults to .venv-golden/bin/python
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-$ROOT/.venv-golden/bin/python}
MODEL=$ROOT/models/cedar-mini
OUT=$ROOT/tests/model/data/golden-mini
if [ ! -x "$PY" ]; then
  echo "make_mini_goldens.sh: no Python at $PY; create it with:" >&2
  echo "  python3 -m venv $ROOT/.venv-golden && $ROOT/.venv-golden/bin/pip install -r $ROOT/tools/golden/requirements.txt" >&2
  exit 1
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json
"$PY" - "$ROOT" "$MODEL" "$OUT" <<'EOF'
import json, os, subprocess, sys
root, model, out = sys.argv[1:4]
prompts = json.load(open(os.path.join(root, "tools/train/mini_prompts.json")))["prompts"]
runs = []
for i, p in enumerate(prompts):
    length = 64 if i % 2 == 0 else 97
    for keys in ("reference", "owner") if i < 2 else ("reference",):
        name = f"mini-{p['name']}-{length}-{keys}.json"
        subprocess.run([sys.executable, os.path.join(root, "tools/golden/reference_forward.py"), "--checkpoint", model,
                        "--prompt-text", p["text"], "--prompt-len", str(length), "--max-new-tokens", "8",
                        "--index-keys", keys, "--out", os.path.join(out, name)], check=True)
        g = json.load(open(os.path.join(out, name)))
        runs.append({"file": name, "prompt": p["name"], "prompt_tokens": length, "index_keys": keys,
                     "greedy_ids": g["greedy_ids"], "ties": g["ties"]})
        print(name, g["greedy_ids"], file=sys.stderr)
json.dump({"model": "models/cedar-mini", "generator": "tools/golden/reference_forward.py", "runs": runs},
          open(os.path.join(out, "manifest.json"), "w"), indent=1)
EOF
