#!/usr/bin/env python3
"""The front ends use the public API: every `#include "..."` in tools/ must name a header of
include/cedar/ ("cedar/engine.h") or a file beside the includer ("args.h"), unless the exception
table below lists that (file, header) pair.

  scripts/check_public_api.py

Fails (exit 1, one line per problem) on an include of any other header (a module's internal one,
"spec/layer_plan.h"), on a "cedar/..." header that does not exist, and on an exception no include
uses any more (so the table only shrinks). Standard library only; run by CTest as `layout_public_api`.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
PUBLIC = os.path.join(ROOT, "include")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# The front-end code that reads the engine's inside, and why. Each entry names its headers; an
# entry is removed when its file no longer needs them (the check fails on an unused one).
EXCEPTIONS = {
    # `cedar bench` times the kernels, the quantisers and the weight prefetch on the model's own
    # weights, and the sampler: what it measures is the inside.
    "tools/cli/cmd_bench.cc": {"spec/weight_inventory.h", "ops/linear/bf16_coded.h", "ops/formats/formats.h", "ops/kernel_set.h",
                               "ops/simd/prefetch.h", "ops/sample/sample.h", "runtime/sampler.h"},
    "tools/cli/bench_streaming.cc": {"spec/weight_inventory.h", "ops/kernel_set.h", "ops/sample/sample.h"},
    # `cedar inspect`, `cedar kv-report` and the model summary print the model's layout: config,
    # layer plan, tensor inventory and weight map, KV geometry, expert placement.
    "tools/cli/cmd_inspect.cc": {"dist/placement.h", "spec/config.h", "spec/layer_plan.h", "spec/weight_inventory.h",
                                 "weights/weight_map.h"},
    "tools/cli/cmd_kv_report.cc": {"kv/geometry.h", "kv/report.h", "spec/config.h", "model/kv_layout.h",
                                   "spec/layer_plan.h"},
    "tools/cli/model_summary.h": {"spec/config.h", "spec/layer_plan.h", "spec/weight_inventory.h"},
    # --expert-parallel: the MPI cluster and the experts' placement over the layer plan.
    "tools/cli/expert_parallel.h": {"dist/cluster.h"},
    "tools/cli/expert_parallel.cc": {"spec/layer_plan.h"},
}


def main():
    problems, used = [], set()
    for dirpath, dirs, files in os.walk(TOOLS):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith((".h", ".cc", ".cpp", ".inc")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                header = m.group(1)
                if os.path.isfile(os.path.join(dirpath, header)):
                    continue  # the front end's own file
                if header.startswith("cedar/"):
                    if not os.path.isfile(os.path.join(PUBLIC, header)):
                        problems.append(f"{rel}:{lineno} includes {header}, which include/cedar/ does not have")
                    continue
                if header in EXCEPTIONS.get(rel, ()):
                    used.add((rel, header))
                    continue
                problems.append(f"{rel}:{lineno} includes \"{header}\", a header inside cedar: use the public API "
                                f"(include/cedar/*.h; add what the front end needs there), or, for code that must "
                                f"read the inside, list the pair with its reason in scripts/check_public_api.py")
    for rel, headers in sorted(EXCEPTIONS.items()):
        for header in sorted(headers):
            if (rel, header) not in used:
                problems.append(f"the exception ({rel}, {header}) is no longer used: remove it from "
                                f"scripts/check_public_api.py")
    for p in problems:
        print("check_public_api: " + p)
    if not problems:
        print(f"check_public_api: tools/ includes only include/cedar/ and its own files, "
              f"plus {len(used)} listed exceptions in {len(EXCEPTIONS)} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
