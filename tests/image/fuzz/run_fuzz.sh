#!/usr/bin/env bash
# Builds the image decoder fuzzer with clang (libFuzzer + ASan + UBSan) against Debian's libpng,
# libjpeg-turbo, libwebp and giflib, and runs it for a bounded time over the committed seed corpus.
# Registered with CTest as image_fuzz_decode.
#   run_fuzz.sh SOURCE_DIR WORK_DIR
# Environment: FUZZ_SECONDS (default 20), FUZZ_RUNS (default 200000; whichever ends first),
# CLANGXX (default: clang++-14, then clang++). Exit 77 = skipped (no usable clang).
set -euo pipefail
SRC=$1
WORK=$2
SECONDS_BUDGET=${FUZZ_SECONDS:-20}
RUNS=${FUZZ_RUNS:-200000}
HERE="$SRC/tests/image/fuzz"

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
BIN="$WORK/decode_image_fuzzer"
SOURCES=("$HERE/decode_image_fuzzer.cc" "$SRC"/src/image/*.cc "$SRC/src/core/status.cc" "$SRC/src/core/check.cc"
         "$SRC/src/core/log.cc")
rebuild=1
if [ -x "$BIN" ]; then
  rebuild=0
  for f in "${SOURCES[@]}" "$SRC"/src/image/*.h "$SRC"/src/core/*.h; do
    if [ "$f" -nt "$BIN" ]; then rebuild=1; break; fi
  done
fi
if [ $rebuild = 1 ]; then
  echo "building $BIN with $CXX"
  if ! "$CXX" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=undefined -I"$SRC/src" "${SOURCES[@]}" \
      $(pkg-config --cflags --libs libpng libjpeg libwebp libwebpdemux libgif) -o "$BIN.tmp" 2>"$WORK/build.log"; then
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
"$BIN" -max_total_time="$SECONDS_BUDGET" -runs="$RUNS" -max_len=65536 -timeout=10 -rss_limit_mb=1024 \
  -artifact_prefix="$WORK/" -print_final_stats=1 "$WORK/corpus" "$HERE/corpus"
