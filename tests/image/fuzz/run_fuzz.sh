#!/usr/bin/env bash
# Builds the image decoder fuzzer with clang (libFuzzer + ASan + UBSan) against Debian's libpng,
# libjpeg-turbo, libwebp and giflib, and runs it for a bounded time over the committed seed corpus
# (tests/fuzz/libfuzzer.sh). Registered with CTest as image_fuzz_decode.
#   run_fuzz.sh SOURCE_DIR WORK_DIR
# Environment: FUZZ_SECONDS (default 20), FUZZ_RUNS (default 200000; whichever ends first),
# CLANGXX (default: clang++-14, then clang++). Exit 77 = skipped (no usable clang).
set -euo pipefail
SRC=$1
WORK=$2
HERE="$SRC/tests/image/fuzz"
BIN="$WORK/decode_image_fuzzer"
RUNS=200000
SOURCES=("$HERE/decode_image_fuzzer.cc" "$SRC"/src/image/*.cc "$SRC/src/core/status.cc" "$SRC/src/core/check.cc"
         "$SRC/src/core/log.cc")
HEADERS=("$SRC"/src/image/*.h "$SRC"/src/core/*.h)
read -r -a LINK <<< "$(pkg-config --cflags --libs libpng libjpeg libwebp libwebpdemux libgif)"
FUZZ_ARGS=(-max_len=65536 -rss_limit_mb=1024)
source "$SRC/tests/fuzz/libfuzzer.sh"
fuzz_build_and_run
