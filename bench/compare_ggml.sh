#!/usr/bin/env bash
# Side-by-side GEMV throughput of cedar's fast kernels and ggml's CPU kernels on the DeepSeek-V4.1
# shapes (issue 13's table), with 1 and 2 threads, in one run on this machine. Not part of CI.
#
# ggml comes from the llama.cpp copy vendored in the llama-cpp-python sdist on PyPI (pinned below),
# built outside the tree in $WORK; nothing of it is committed. Its test-backend-ops has no thread
# option, so a local patch reads the count from GGML_NTHREADS and adds the shapes below to its perf
# cases. ggml's MXFP4 has the same 4.25 bits/weight as V4.1's FP4 experts (E2M1 + E8M0 per 32);
# q8_0 stands in for FP8 (8.5 bits/weight vs 8 + 1/128); bf16 is bf16.
#
# usage: bench/compare_ggml.sh [BUILD_DIR]   (default build; cedar_bench must be built there)
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

for t in 1 2; do
  # test-backend-ops gives its CPU backend N_THREADS/2 threads.
  GGML_NTHREADS=$((2 * t)) "$WORK/build/bin/test-backend-ops" perf -o MUL_MAT -b CPU >"$WORK/ggml_t$t.txt" 2>&1 || true
done
"$BUILD/bench/cedar_bench" --benchmark_filter='BM_OpsLinear(Fp8|Fp4)/[0-9]+/[0-9]+/1/[12]/1/[0-9]+/|BM_OpsLinearBf16/[0-9]+/[0-9]+/[12]/1/' \
  --benchmark_min_time=0.5 --benchmark_format=json >"$WORK/cedar.json" 2>/dev/null

python3 - "$WORK" <<'EOF'
import json, re, sys
work = sys.argv[1]
ggml = {}
for t in (1, 2):
    for line in open(f"{work}/ggml_t{t}.txt"):
        m = re.search(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=1,k=(\d+),bs=\[1,1\],nr=\[1,1\].*?([\d.]+) us/run", line)
        if m:
            kind, rows, k = m.group(1), int(m.group(2)), int(m.group(3))
            # ggml's own weight bytes: MXFP4 17 and q8_0 34 bytes per 32 weights, bf16 2 per weight.
            nbytes = rows * k * {"mxfp4": 17 / 32, "q8_0": 34 / 32, "bf16": 2}[kind]
            ggml[(kind, rows, k, t)] = nbytes / (float(m.group(4)) * 1e-6) / 1e9
cedar = {}
for b in json.load(open(f"{work}/cedar.json"))["benchmarks"]:
    parts = b["name"].split("/")
    kind = {"BM_OpsLinearFp4": "mxfp4", "BM_OpsLinearFp8": "q8_0", "BM_OpsLinearBf16": "bf16"}[parts[0]]
    copies = 8
    if kind == "bf16":
        n, k, t, mode = map(int, parts[1:5])
    else:
        n, k, m, t, mode, copies = map(int, parts[1:7])
        if m != 1:
            continue
    if mode == 1:
        cedar[(kind, n, k, t, copies)] = b["bytes_per_second"] / 1e9
label = {"mxfp4": "FP4 (ggml MXFP4)", "q8_0": "FP8 (ggml q8_0)", "bf16": "bf16"}
# ggml's test-backend-ops reuses one weight copy, so a matrix that fits the last-level cache stays
# there between runs; cedar's row is the same hot measurement (1 copy) for the block formats, with the
# cold figure (8 copies cycled, as a real model's weights) beside it. bf16 16384x5120 (168 MB) is
# read from DRAM on both sides (cedar cycles 4 copies).
print("| single-token GEMV | T | cedar fast GB/s | ggml GB/s | cedar / ggml | cedar cold (8 copies) GB/s |")
print("|---|---|---|---|---|---|")
for kind, n, k in [("mxfp4", 2304, 5120), ("mxfp4", 32768, 5120), ("q8_0", 2304, 5120), ("q8_0", 32768, 1280), ("bf16", 16384, 5120)]:
    for t in (1, 2):
        hot = kind != "bf16"
        c, g = cedar.get((kind, n, k, t, 1 if hot else 8)), ggml.get((kind, n, k, t))
        cold = cedar.get((kind, n, k, t, 8))
        ratio = f"{c / g:.2f}" if c and g else "n/a"
        cs = f"{c:.1f}" if c else "n/a"
        gs = f"{g:.1f}" if g else "n/a"
        colds = f"{cold:.1f}" if cold and hot else ""
        print(f"| {label[kind]} {n}x{k} | {t} | {cs} | {gs} | {ratio} | {colds} |")
EOF
