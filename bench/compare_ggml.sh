#!/usr/bin/env bash
# Side-by-side GEMV throughput of cedar's fast kernels and ggml's CPU kernels on the DeepSeek-V4.1
# shapes (issue 13's table), with 1 and 2 threads, in one run on this machine. Not part of CI.
#
# ggml comes from the llama.cpp copy vendored in the llama-cpp-python sdist on PyPI (pinned below),
# built outside the tree in $WORK; nothing of it is committed. Its test-backend-ops has no thread
# option, so a local patch reads the count from GGML_NTHREADS and adds the shapes below to its perf
# cases. ggml's MXFP4 has the same 4.25 bits/weight as V4.1's FP4 experts (E2M1 + E8M0 per 32);
# q8_0 stands in for FP8 (8.5 bits/weight vs 8 + 1/128); bf16 is bf16 on ggml's side, and cedar's bf16
# row is its GEMV as the model runs the head in fast numerics, on the weights re-coded losslessly in 12
# bits (ops/linear/bf16_coded.h), with a second row of the same kernel family on the plain bf16 bits.
#
# usage: [ROUNDS=3] [SHAPES=...] bench/compare_ggml.sh [BUILD_DIR]   (default build; cedar_bench must be built there)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
LLAMA_CPP_PYTHON_VERSION=0.3.36
WORK=${WORK:-/tmp/cedar-ggml}
mkdir -p "$WORK"

SRC="$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
if [ ! -d "$SRC" ]; then
  python3 -m pip download --quiet --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar xzf "$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$WORK"
fi
TBO="$SRC/tests/test-backend-ops.cpp"
if ! grep -q CEDAR_COMPARE "$TBO"; then
  python3 - "$TBO" <<'EOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
# Thread count from the environment (CEDAR_COMPARE marks the patched file).
s = re.sub(r"#\s*define N_THREADS std::thread::hardware_concurrency\(\)",
           "#   define N_THREADS (std::getenv(\"GGML_NTHREADS\") ? std::atoi(std::getenv(\"GGML_NTHREADS\")) : 1) /* CEDAR_COMPARE */",
           s, count=1)
cases = """
    // CEDAR_COMPARE: DeepSeek-V4.1 GEMV shapes (rows m, one token, k)
    for (auto [ta, m, k] : std::vector<std::tuple<ggml_type, int64_t, int64_t>>{
             {GGML_TYPE_MXFP4, 2304, 5120}, {GGML_TYPE_MXFP4, 32768, 5120},
             {GGML_TYPE_Q8_0, 2304, 5120}, {GGML_TYPE_Q8_0, 32768, 1280}, {GGML_TYPE_BF16, 16384, 5120}}) {
        test_cases.emplace_back(new test_mul_mat(ta, GGML_TYPE_F32, m, 1, k, {1, 1}, {1, 1}));
    }
    return test_cases;
"""
anchor = "static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {\n    std::vector<std::unique_ptr<test_case>> test_cases;\n"
assert anchor in s, "test-backend-ops layout changed"
s = s.replace(anchor, anchor + cases, 1)
if "#include <cstdlib>" not in s:
    s = "#include <cstdlib>\n" + s
open(p, "w").write(s)
EOF
fi
if [ ! -x "$WORK/build/bin/test-backend-ops" ]; then
  cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$WORK/build" --target test-backend-ops -j "$(nproc)"
fi

# The bf16 row once more with both sides in one process (bench/ggml_bf16_side_by_side.cc), against
# the ggml libraries built above and cedar's libraries in $BUILD.
GGML_ROOT="$SRC/ggml"
"${CXX:-g++}" -O2 -std=c++20 -I"$GGML_ROOT/include" -Isrc bench/ggml_bf16_side_by_side.cc -o "$WORK/ggml_bf16_side_by_side" \
  "$BUILD/src/ops/libcedar_ops.a" "$BUILD/src/core/libcedar_core.a" "$WORK/build/ggml/src/libggml.a" \
  "$WORK/build/ggml/src/libggml-cpu.a" "$WORK/build/ggml/src/libggml-base.a" -lhwy -fopenmp -lpthread -ldl

# The VM's memory bandwidth drifts with its neighbours within minutes, so the two sides alternate
# shape by shape: each of ROUNDS rounds runs, for every shape, ggml with 1 and 2 threads and then cedar
# with both, back to back (about 20 s). Each ratio is taken within a round and the median over the
# rounds reported.
ROUNDS=${ROUNDS:-3}
# SHAPES (type:rows:k, space-separated) reruns some rows only, e.g. SHAPES=bf16:16384:5120 ROUNDS=9.
SHAPES=${SHAPES:-"mxfp4:2304:5120 mxfp4:32768:5120 q8_0:2304:5120 q8_0:32768:1280 bf16:16384:5120"}
for r in $(seq 1 "$ROUNDS"); do
  rm -f "$WORK"/ggml_t[12]_r"$r".txt "$WORK"/cedar_r"$r"_*.json "$WORK"/inprocess_t[12]_r"$r".txt
  for shape in $SHAPES; do
    IFS=: read -r type m k <<<"$shape"
    for t in 1 2; do
      # test-backend-ops gives its CPU backend N_THREADS/2 threads; -p keeps only this shape.
      GGML_NTHREADS=$((2 * t)) "$WORK/build/bin/test-backend-ops" perf -o MUL_MAT -b CPU \
        -p "type_a=$type,type_b=f32,m=$m,n=1,k=$k,bs=\\[1,1\\],nr=\\[1,1\\]" >>"$WORK/ggml_t${t}_r$r.txt" 2>&1 || true
    done
    case $type in
      mxfp4) filter="BM_OpsLinearFp4/$m/$k/1/[12]/1/[0-9]+/" ;;
      q8_0) filter="BM_OpsLinearFp8/$m/$k/1/[12]/1/[0-9]+/" ;;
      bf16) filter="BM_OpsLinearBf16/$m/$k/[12]/1/[0-9]+/[01]/" ;;
    esac
    "$BUILD/bench/cedar_bench" --benchmark_filter="$filter" --benchmark_min_time=0.5 --benchmark_format=json \
      >"$WORK/cedar_r${r}_$type-$m-$k.json" 2>/dev/null
    if [ "$type" = bf16 ]; then
      for t in 1 2; do "$WORK/ggml_bf16_side_by_side" "$t" 20 >"$WORK/inprocess_t${t}_r$r.txt"; done
    fi
  done
done
python3 - "$WORK" "$ROUNDS" "$SHAPES" <<'EOF'
import glob, json, re, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
shapes = [(t, int(m), int(k)) for t, m, k in (s.split(":") for s in sys.argv[3].split())]
# Weight bytes per weight on each side: ggml's MXFP4 17 and q8_0 34 bytes per 32 weights, bf16 2;
# cedar's FP4 the same 17/32, FP8 one byte plus one E8M0 scale per 32x32 block, bf16 2.
# cedar_bench counts 2 bytes per weight for the bf16 GEMV in both of cedar's forms (the coded form reads
# 1.5), so its GB/s compare as times do.
GGML_BPW = {"mxfp4": 17 / 32, "q8_0": 34 / 32, "bf16": 2, "bf16-plain": 2}
CEDAR_BPW = {"mxfp4": 17 / 32, "q8_0": 1 + 1 / 1024, "bf16": 2, "bf16-plain": 2}


def ggml_round(r):
    out = {}
    for t in (1, 2):
        for line in open(f"{work}/ggml_t{t}_r{r}.txt"):
            m = re.search(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=1,k=(\d+),bs=\[1,1\],nr=\[1,1\].*?([\d.]+) us/run", line)
            if m:
                kind, rows, k = m.group(1), int(m.group(2)), int(m.group(3))
                out[(kind, rows, k, t)] = rows * k * GGML_BPW[kind] / (float(m.group(4)) * 1e-6) / 1e9
    return out


def cedar_round(r):
    out = {}
    for path in glob.glob(f"{work}/cedar_r{r}_*.json"):
        for b in json.load(open(path))["benchmarks"]:
            parts = b["name"].split("/")
            kind = {"BM_OpsLinearFp4": "mxfp4", "BM_OpsLinearFp8": "q8_0", "BM_OpsLinearBf16": "bf16"}[parts[0]]
            if kind == "bf16":
                n, k, t, mode, copies, coded = map(int, parts[1:7])
                if not coded:  # cedar's kernel on plain bf16, beside the coded form the model runs
                    kind = "bf16-plain"
            else:
                n, k, m, t, mode, copies = map(int, parts[1:7])
                if m != 1:
                    continue
            if mode == 1:
                out[(kind, n, k, t, copies)] = b["bytes_per_second"] / 1e9
    return out


ggml = [ggml_round(r) for r in range(1, rounds + 1)]
cedar = [cedar_round(r) for r in range(1, rounds + 1)]
med = lambda xs: statistics.median(xs) if xs else None
fmt = lambda x, f="{:.1f}": f.format(x) if x is not None else "n/a"
label = {"mxfp4": "FP4 (ggml MXFP4)", "q8_0": "FP8 (ggml q8_0)", "bf16": "bf16 (cedar: 12-bit coded, as its head)",
         "bf16-plain": "bf16 (cedar: plain bf16)"}
# ggml's test-backend-ops reuses one weight copy, so a matrix that fits the last-level cache stays
# there between runs, and L3 keeps part of one that does not (bf16 16384x5120, 168 MB: one copy reads
# 5-10 % faster than four cycled). cedar's row is the same measurement (1 copy), with the cold figure
# (8 copies cycled, 4 for bf16, as a real model's weights) beside it. cedar's weights sit on 2 MiB
# pages, as its mapped checkpoint does; ggml's on whatever its allocator gets (4 KiB where transparent
# huge pages are madvise-only), as llama.cpp's mapped GGUF does. "Same GEMV" compares the time one GEMV
# of the shape takes (weights per second): q8_0 reads 6 % more bytes than cedar's FP8 for the same work.
print(f"Medians over {rounds} alternating rounds; each ratio is taken within a round.\n")
print("| single-token GEMV | T | cedar fast GB/s | ggml GB/s | cedar / ggml (GB/s) | cedar / ggml (same GEMV) "
      "| same GEMV, per round | cedar cold GB/s (copies) |")
print("|---|---|---|---|---|---|---|---|")
rows = []
for kind, n, k in shapes:
    rows.append((kind, kind, n, k))
    if kind == "bf16":
        rows.append(("bf16-plain", kind, n, k))
for kind, gkind, n, k in rows:
    cold_copies = 4 if kind.startswith("bf16") else 8
    for t in (1, 2):
        key, gkey = (kind, n, k, t, 1), (gkind, n, k, t)
        cs = [c[key] for c in cedar if key in c]
        gs = [g[gkey] for g in ggml if gkey in g]
        ratios = [c[key] / g[gkey] for c, g in zip(cedar, ggml) if key in c and gkey in g]
        same = [x * GGML_BPW[kind] / CEDAR_BPW[kind] for x in ratios]
        colds = [c[(kind, n, k, t, cold_copies)] for c in cedar if (kind, n, k, t, cold_copies) in c]
        print(f"| {label[kind]} {n}x{k} | {t} | {fmt(med(cs))} | {fmt(med(gs))} | {fmt(med(ratios), '{:.2f}')} "
              f"| {fmt(med(same), '{:.2f}')} | {' / '.join(f'{x:.2f}' for x in same)} "
              f"| {fmt(med(colds))} ({cold_copies}) |")

# The in-process runs of the bf16 GEMV: each line "threads ggml_us cedar_us ratio plain_us plain_ratio",
# cedar_us its coded form's time, plain_us its kernel's on the plain bf16 bits, each ratio the median over
# 20 back-to-back rounds of ggml's time / cedar's.
inproc = {1: [], 2: []}
for r in range(1, rounds + 1):
    for t in (1, 2):
        try:
            fields = open(f"{work}/inprocess_t{t}_r{r}.txt").read().split()
            inproc[t].append(tuple(map(float, fields[1:6])))
        except (OSError, ValueError):
            pass
if any(inproc.values()):
    print("\nbf16 16384x5120 with both sides in one process, alternating call by call "
          "(bench/ggml_bf16_side_by_side.cc; GB/s from the per-run median times):\n")
    print("| T | cedar GB/s (coded) | ggml GB/s | cedar / ggml (same GEMV) | per run "
          "| cedar on plain bf16 GB/s | plain / ggml | per run |")
    print("|---|---|---|---|---|---|---|---|")
    gb = 16384 * 5120 * 2 / 1e3  # bf16 bytes: GB/s compare as times do
    for t in (1, 2):
        runs = inproc[t]
        if runs:
            print(f"| {t} | {gb / med([r[1] for r in runs]):.1f} | {gb / med([r[0] for r in runs]):.1f} "
                  f"| {med([r[2] for r in runs]):.2f} | {' / '.join(f'{r[2]:.2f}' for r in runs)} "
                  f"| {gb / med([r[3] for r in runs]):.1f} | {med([r[4] for r in runs]):.2f} "
                  f"| {' / '.join(f'{r[4]:.2f}' for r in runs)} |")
EOF
