#!/usr/bin/env bash
# `cedar check-shards` on the broken checkpoints of tests/io/data/checkpoints (made by
# make_bad_checkpoints.py): each must exit 1 (not 0, not a signal) with one error that names the
# shard file and the tensor; the sound one must exit 0. Registered with CTest (label io).
#   cli_broken_checkpoints.sh CEDAR_BINARY CHECKPOINTS_DIR
set -uo pipefail
CEDAR=$1
DATA=$2
if [ ! -x "$CEDAR" ]; then
  echo "FAILED: $CEDAR is not built (cmake --build <dir> --target cedar)"
  exit 1
fi
failures=0

# expect CASE RC SUBSTRING...: runs check-shards on DATA/CASE, checks the exit code and output.
expect() {
  local case=$1 want_rc=$2
  shift 2
  local out rc
  out=$("$CEDAR" check-shards "$DATA/$case" 2>&1)
  rc=$?
  if [ "$rc" != "$want_rc" ]; then
    echo "FAIL $case: exit code $rc, expected $want_rc; output:"
    echo "$out"
    failures=$((failures + 1))
    return
  fi
  for s in "$@"; do
    if [[ "$out" != *"$s"* ]]; then
      echo "FAIL $case: output lacks '$s'; output:"
      echo "$out"
      failures=$((failures + 1))
      return
    fi
  done
  echo "ok   $case (exit $rc): $out" | head -1
}

S1=model-00001-of-00002.safetensors
S2=model-00002-of-00002.safetensors
expect good 0 "ok: 4 tensors in 2 shard(s)"
expect truncated 1 "DataLoss" "$S2" "tensor 'layers.0.ffn.w2.scale'" "truncated"
expect lying_offsets 1 "DataLoss" "$S1" "tensor 'norm.weight'" "overlap tensor 'embed.weight'"
expect wrong_dtype 1 "DataLoss" "$S2" "tensor 'layers.0.ffn.w2.scale'" "unknown dtype 'F8_E8M1'"
expect missing_tensor 1 "DataLoss" "$S1" "tensor 'head.weight' is missing"
expect missing_shard 1 "NotFound" "$S2" "'layers.0.ffn.w2.scale'"
expect path_traversal 1 "DataLoss" "../good/$S1" "tensor 'embed.weight'"
# Usage errors are exit 2.
"$CEDAR" check-shards >/dev/null 2>&1
rc=$?
if [ "$rc" != 2 ]; then echo "FAIL usage: exit code $rc, expected 2"; failures=$((failures + 1)); fi

if [ "$failures" != 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases passed"
