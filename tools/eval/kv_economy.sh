#!/usr/bin/env bash
# The KV economy's cost (issue 11 item 6, docs/EVAL.md): prints the markdown table of `cedar eval
# --compare` for a checkpoint and held-out text files: bf16 KV vs the FP8/FP4 reference, bounded replay
# vs full recompute, decoder narrowing vs full prefill, fast vs exact numerics, each as delta
# cross-entropy and greedy-token agreement next to the bytes or work it saves.
#
#   tools/eval/kv_economy.sh MODEL_DIR FILE...
#   CTX=512 RESUME_AT=256 MAX_TOKENS=4096 THREADS=2 tools/eval/kv_economy.sh models/cedar-mini held/*.py
#
# CEDAR_BIN selects the binary (default: build/tools/cli/cedar of this repository).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 MODEL_DIR FILE... (env: CTX, RESUME_AT, MAX_TOKENS, THREADS, CEDAR_BIN)" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${CEDAR_BIN:-$root/build/tools/cli/cedar}"
if [[ ! -x "$bin" ]]; then
  echo "$0: $bin not found: build first (scripts/build.sh) or set CEDAR_BIN" >&2
  exit 1
fi
model="$1"
shift
args=(eval -m "$model" --files "$@" --compare --ctx "${CTX:-512}")
[[ -n "${RESUME_AT:-}" ]] && args+=(--resume-at "$RESUME_AT")
[[ -n "${MAX_TOKENS:-}" ]] && args+=(--max-tokens "$MAX_TOKENS")
[[ -n "${THREADS:-}" ]] && args+=(--threads "$THREADS")
echo "\$ cedar ${args[*]}"
exec "$bin" "${args[@]}"
