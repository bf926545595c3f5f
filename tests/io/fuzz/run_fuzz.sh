#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a
# bounded time over the committed seed corpus (tests/fuzz/libfuzzer.sh). Registered with CTest as
# io_fuzz_safetensors_header.
#   run_fuzz.sh SOURCE_DIR WORK_DIR
# Environment: FUZZ_SECONDS (default 20), FUZZ_RUNS (default 2000000; whichever ends first),
# CLANGXX (default: clang++-14, then clang++). Exit 77 = skipped (no usable clang).
set -euo pipefail
SRC=$1
WORK=$2
HERE="$SRC/tests/io/fuzz"
BIN="$WORK/safetensors_header_fuzzer"
RUNS=2000000
SOURCES=("$HERE/safetensors_header_fuzzer.cc" "$SRC/src/io/safetensors.cc" "$SRC/src/io/mapped_file.cc"
         "$SRC/src/core/status.cc" "$SRC/src/core/dtype.cc" "$SRC/src/core/check.cc")
HEADERS=("$SRC"/src/io/*.h "$SRC"/src/core/*.h)
LINK=()
FUZZ_ARGS=(-max_len=8192 -rss_limit_mb=2048 -dict="$HERE/safetensors.dict")
source "$SRC/tests/fuzz/libfuzzer.sh"
fuzz_build_and_run
