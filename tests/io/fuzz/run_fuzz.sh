#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a
# bounded time over the committed seed corpus. Registered with CTest as io_fuzz_safetensors_header.
#   run_fuzz.sh SOURCE_DIR WORK_DIR
# Environment: FUZZ_SECONDS (default 20), FUZZ_RUNS (default 2000000; whichever ends first),
# CLANGXX (default: clang++-14, then clang++). Exit 77 = skipped (no usable clang).
set -euo pipefail
SRC=$1
WORK=$2
SECONDS_BUDGET=${FUZZ_SECONDS:-20}
RUNS=${FUZZ_RUNS:-2000000}
HERE="$SRC/tests/io/fuzz"

CXX=${CLANGXX:-}
if [ -z "$CXX" ]; then
  for c in clang++-14 clang++; do
    if command -v "$c" >/dev/null 2>&1; then CXX=$c; break; fi
  done
fi
if [ -z "$CXX" ]; then
  echo "SKIPPED: no clang++ found; the libFuzzer target needs clang (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi

mkdir -p "$WORK/corpus"
BIN="$WORK/safetensors_header_fuzzer"
SOURCES=("$HERE/safetensors_header_fuzzer.cc" "$SRC/src/io/safetensors.cc" "$SRC/src/io/mapped_file.cc"
         "$SRC/src/core/status.cc" "$SRC/src/core/dtype.cc" "$SRC/src/core/check.cc")
# Rebuild only when a source or header is newer than the binary (a clang build takes ~1 min).
rebuild=1
if [ -x "$BIN" ]; then
  rebuild=0
  for f in "${SOURCES[@]}" "$SRC"/src/io/*.h "$SRC"/src/core/*.h; do
    if [ "$f" -nt "$BIN" ]; then rebuild=1; break; fi
  done
fi
if [ $rebuild = 1 ]; then
  echo "building $BIN with $CXX"
  if ! "$CXX" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=undefined -I"$SRC/src" "${SOURCES[@]}" -o "$BIN.tmp" 2>"$WORK/build.log"; then
    if grep -qiE "libclang_rt\.fuzzer|cannot find -l|unsupported option.*fuzzer" "$WORK/build.log"; then
      cat "$WORK/build.log"
      echo "SKIPPED: $CXX cannot link libFuzzer here (install libclang-rt-14-dev)"
      exit 77
    fi
    cat "$WORK/build.log"
    echo "FAILED: the fuzz target does not compile"
    exit 1
  fi
  mv "$BIN.tmp" "$BIN"
fi

# New inputs go to the scratch corpus (first dir); the committed seeds are only read.
echo "fuzzing for at most ${SECONDS_BUDGET}s / ${RUNS} runs"
"$BIN" -max_total_time="$SECONDS_BUDGET" -runs="$RUNS" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict="$HERE/safetensors.dict" -artifact_prefix="$WORK/" -print_final_stats=1 \
  "$WORK/corpus" "$HERE/corpus"
