#!/usr/bin/env bash
# SSD streaming benchmark (not in CI; needs root for dropping the page cache, fio, ~20 GB of disk).
#   bench/stream_bench.sh [CKPT_DIR] [BUDGETS]
# Writes the `make-tiny --preset stream` checkpoint (released expert shapes) into CKPT_DIR when it is
# not there, measures the device's random-read bandwidth with fio at the block size the expert reader
# uses (1 MiB, O_DIRECT, io_uring), then for each budget drops the page cache and runs
# `cedar bench --memory-budget` (prefill, then decode on the same sequence). Prints one Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
CEDAR=${CEDAR:-build/tools/cli/cedar}
CKPT=${1:-/tmp/cedar-stream-ckpt}
BUDGETS=${2:-100%,50%,25%}
PROMPT=${PROMPT:-256}
GEN=${GEN:-24}
PROMPT_FILE=${PROMPT_FILE:-docs/NUMERICS.md}   # real text: its n-grams repeat, as Engram rows do in use
NO_LOOKAHEAD_BUDGET=${NO_LOOKAHEAD_BUDGET:-25%}  # one more run without look-ahead ('' for none)
THREADS=${THREADS:-$(nproc)}
command -v fio >/dev/null || { echo "stream_bench: needs fio (apt-get install fio)" >&2; exit 1; }
[ -x "$CEDAR" ] || { echo "stream_bench: build cedar first ($CEDAR)" >&2; exit 1; }
[ -f "$CKPT/config.json" ] || "$CEDAR" make-tiny --out "$CKPT" --preset stream

drop_caches() {
  sync
  if ! echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    echo "stream_bench: cannot drop the page cache (needs root); figures include cached reads" >&2
  fi
}

# fio on the largest shard: random 1 MiB O_DIRECT reads, 16 in flight (the expert reader's queue).
SHARD=$(ls -S "$CKPT"/*.safetensors | head -1)
drop_caches
FIO_JSON=$(fio --name=randread --filename="$SHARD" --readonly --rw=randread --bs=1M --direct=1 \
  --ioengine=io_uring --iodepth=16 --runtime=${FIO_SECONDS:-15} --time_based --output-format=json)
FIO_BW=$(printf '%s' "$FIO_JSON" | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"])')
echo "fio random read, 1 MiB blocks, O_DIRECT, iodepth 16 on $(basename "$SHARD"): $(python3 -c "print(f'{$FIO_BW/1e9:.2f}')") GB/s" >&2

HEADER_DONE=0
run() {  # budget [extra flags]
  drop_caches
  OUT=$("$CEDAR" bench -m "$CKPT" --memory-budget "$1" -p "$PROMPT" -n "$GEN" -t "$THREADS" \
        --fio-bandwidth "$FIO_BW" --residency-stats none --prompt-file "$PROMPT_FILE" "${@:2}")
  if [ $HEADER_DONE -eq 0 ]; then printf '%s\n' "$OUT"; HEADER_DONE=1; else printf '%s\n' "$OUT" | tail -n +3; fi
}
IFS=',' read -ra LIST <<< "$BUDGETS"
for b in "${LIST[@]}"; do run "$b"; done
[ -n "$NO_LOOKAHEAD_BUDGET" ] && run "$NO_LOOKAHEAD_BUDGET" --no-lookahead
exit 0
