#!/usr/bin/env python3
"""The module DAG, checked: every include edge between src/ modules must be a dependency its CMake file declares.

  scripts/check_deps.py [--print]

The DAG's one source of truth is each module's `cedar_module(cedar_NAME DEPS ...)` in
src/PATH/CMakeLists.txt: a module is a folder of src/ with such a file, named after its path
(src/serve/http is cedar_serve_http, its headers "serve/http/..."). This script reads those
declarations and every `#include "PATH/..."` in the module's folder, and fails (exit 1, one line per
problem) when
  - a file includes a header of a module its CMake file does not declare (directly), or
  - a module declares a dependency none of its files includes (the declarations are the DAG), or
  - the declared dependencies form a cycle, or
  - a source file under src/ belongs to no module.
`--print` writes the DAG in dependency order, one module a line, for docs/ARCHITECTURE.md.
Standard library only; run by CTest as `layout_module_dag`.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_/.]+)"')
MODULE = re.compile(r"cedar_module\(\s*cedar_(\w+)\s+DEPS\s+([^)]*)\)", re.S)
SOURCE = (".h", ".cc", ".inc")


def module_folders():
    """{module path ("serve/http"): CMakeLists.txt} for every folder of src/ with a CMakeLists.txt."""
    found = {}
    for dirpath, dirs, files in os.walk(SRC):
        dirs.sort()
        if "CMakeLists.txt" in files and dirpath != SRC:
            found[os.path.relpath(dirpath, SRC).replace(os.sep, "/")] = os.path.join(dirpath, "CMakeLists.txt")
    return found


def target_of(module):
    return "cedar_" + module.replace("/", "_")


def declared_deps():
    folders = module_folders()
    by_target = {target_of(m)[len("cedar_"):]: m for m in folders}
    deps = {}
    for module, cmake in sorted(folders.items()):
        text = re.sub(r"#.*", "", open(cmake).read())
        m = MODULE.search(text)
        if not m or m.group(1) != target_of(module)[len("cedar_"):]:
            sys.exit(f"check_deps: {cmake} has no cedar_module({target_of(module)} DEPS ...)")
        deps[module] = {by_target[d[len("cedar_"):]] for d in m.group(2).split()
                        if d.startswith("cedar_") and d[len("cedar_"):] in by_target}
    # cedar_* targets that are no folder of src/ are third-party builds (cedar_xgrammar): not modules.
    return deps


def module_of(path, modules):
    """The module whose folder holds `path` (relative to src/, "/"-separated): the longest prefix."""
    best = None
    for m in modules:
        if path.startswith(m + "/") and (best is None or len(m) > len(best)):
            best = m
    return best


def include_edges(modules):
    edges, orphans = {}, []
    for dirpath, dirs, files in os.walk(SRC):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(SOURCE):
                continue
            path = os.path.join(dirpath, f)
            name = module_of(os.path.relpath(path, SRC).replace(os.sep, "/"), modules)
            if name is None:
                orphans.append(os.path.relpath(path, ROOT))
                continue
            for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
                m = INCLUDE.match(line)
                target = m and module_of(m.group(1), modules)
                if target and target != name:
                    edges.setdefault((name, target), []).append(f"{os.path.relpath(path, ROOT)}:{lineno}")
    return edges, orphans


def topological(deps):
    order, state = [], {}

    def visit(node, stack):
        if state.get(node) == "done":
            return None
        if state.get(node) == "open":
            return stack[stack.index(node):] + [node]
        state[node] = "open"
        for d in sorted(deps.get(node, ())):
            cycle = visit(d, stack + [node])
            if cycle:
                return cycle
        state[node] = "done"
        order.append(node)
        return None

    for node in sorted(deps):
        cycle = visit(node, [])
        if cycle:
            return None, cycle
    return order, None


def main():
    deps = declared_deps()
    problems = []
    order, cycle = topological(deps)
    if cycle:
        problems.append("the declared dependencies form a cycle: " + " -> ".join(cycle))
    edges, orphans = include_edges(set(deps))
    for path in orphans:
        problems.append(f"{path} is in no module (no folder above it within src/ has a CMakeLists.txt with "
                        f"cedar_module): move it into one, or give its folder a cedar_module")
    for a in sorted(deps):
        for b in sorted(deps[a]):
            if (a, b) not in edges:
                problems.append(f"src/{a}/CMakeLists.txt declares {target_of(b)} but no file of {a} includes {b}: "
                                f"drop it, so the declarations stay the DAG")
    for (a, b), where in sorted(edges.items()):
        if b not in deps[a]:
            problems.append(f"{a} includes {b} ({where[0]}{' and %d more' % (len(where) - 1) if len(where) > 1 else ''}) "
                            f"but src/{a}/CMakeLists.txt does not declare {target_of(b)}: declare it, if the edge belongs "
                            f"in the DAG, or move the code")
    for p in problems:
        print("check_deps: " + p)
    if "--print" in sys.argv and order:
        for m in order:
            print(f"{m:<11} <- {' '.join(sorted(deps[m])) or '(nothing)'}")
    if not problems:
        print(f"check_deps: {len(deps)} modules, every include edge declared, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
