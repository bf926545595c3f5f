# Shared by the fuzz targets' run_fuzz.sh (sourced, not run): finds clang, builds the target with
# libFuzzer + ASan + UBSan when a source or header is newer than the binary (a clang build takes
# ~1 min), and runs it for a bounded time over the committed seed corpus. The caller sets:
#   SRC (repository root), WORK (scratch folder), HERE (the target's folder with corpus/),
#   BIN (binary path), SOURCES (array), HEADERS (array: headers whose change forces a rebuild),
#   LINK (array: extra compiler/linker flags), FUZZ_ARGS (array: libFuzzer flags of the target),
#   RUNS (default run count; FUZZ_RUNS overrides).
# Environment: FUZZ_SECONDS (default 20), FUZZ_RUNS, CLANGXX (default: clang++-14, then clang++).
# Exit 77 = skipped (no usable clang).
fuzz_build_and_run() {
  local budget=${FUZZ_SECONDS:-20} runs=${FUZZ_RUNS:-$RUNS} cxx=${CLANGXX:-}
  if [ -z "$cxx" ]; then
    for c in clang++-14 clang++; do
      if command -v "$c" >/dev/null 2>&1; then cxx=$c; break; fi
    done
  fi
  if [ -z "$cxx" ]; then
    echo "SKIPPED: no clang++ found; the libFuzzer target needs clang (apt-get install clang libclang-rt-14-dev)"
    exit 77
  fi
  mkdir -p "$WORK/corpus"
  local rebuild=1 f
  if [ -x "$BIN" ]; then
    rebuild=0
    for f in "${SOURCES[@]}" "${HEADERS[@]}"; do
      if [ "$f" -nt "$BIN" ]; then rebuild=1; break; fi
    done
  fi
  if [ $rebuild = 1 ]; then
    echo "building $BIN with $cxx"
    if ! "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=undefined -I"$SRC/src" "${SOURCES[@]}" "${LINK[@]}" -o "$BIN.tmp" \
        2>"$WORK/build.log"; then
      if grep -qiE "libclang_rt\.fuzzer|cannot find -l|unsupported option.*fuzzer" "$WORK/build.log"; then
        cat "$WORK/build.log"
        echo "SKIPPED: $cxx cannot link libFuzzer here (install libclang-rt-14-dev)"
        exit 77
      fi
      cat "$WORK/build.log"
      echo "FAILED: the fuzz target does not compile"
      exit 1
    fi
    mv "$BIN.tmp" "$BIN"
  fi
  # New inputs go to the scratch corpus (first dir); the committed seeds are only read.
  echo "fuzzing for at most ${budget}s / ${runs} runs"
  "$BIN" -max_total_time="$budget" -runs="$runs" -timeout=10 "${FUZZ_ARGS[@]}" -artifact_prefix="$WORK/" \
    -print_final_stats=1 "$WORK/corpus" "$HERE/corpus"
}
