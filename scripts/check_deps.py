#!/usr/bin/env python3
"""The module DAG, checked: every include edge between src/ modules must be a dependency its CMake file declares.

  scripts/check_deps.py [--print]

The DAG's one source of truth is each module's `cedar_module(cedar_NAME DEPS ...)` in
src/NAME/CMakeLists.txt. This script reads those declarations and every `#include "MODULE/..."` in
src/NAME/, and fails (exit 1, one line per problem) when
  - a file includes a header of a module its CMake file does not declare (directly), or
  - a module declares a dependency none of its files includes (the declarations are the DAG), or
  - the declared dependencies form a cycle.
`--print` writes the DAG in dependency order, one module a line, for docs/ARCHITECTURE.md.
Standard library only; run by CTest as `layout_module_dag`.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/')
MODULE = re.compile(r"cedar_module\(\s*cedar_(\w+)\s+DEPS\s+([^)]*)\)", re.S)


def declared_deps():
    deps = {}
    for name in sorted(os.listdir(SRC)):
        cmake = os.path.join(SRC, name, "CMakeLists.txt")
        if not os.path.isfile(cmake):
            continue
        text = re.sub(r"#.*", "", open(cmake).read())
        m = MODULE.search(text)
        if not m or m.group(1) != name:
            sys.exit(f"check_deps: {cmake} has no cedar_module(cedar_{name} DEPS ...)")
        deps[name] = {d[len("cedar_"):] for d in m.group(2).split() if d.startswith("cedar_")}
    # cedar_* targets that are no folder of src/ are third-party builds (cedar_xgrammar): not modules.
    return {name: ds & set(deps) for name, ds in deps.items()}


def include_edges(modules):
    edges = {}
    for name in modules:
        folder = os.path.join(SRC, name)
        for dirpath, _, files in os.walk(folder):
            for f in sorted(files):
                if not f.endswith((".h", ".cc", ".inc")):
                    continue
                path = os.path.join(dirpath, f)
                for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) in modules and m.group(1) != name:
                        edges.setdefault((name, m.group(1)), []).append(f"{os.path.relpath(path, ROOT)}:{lineno}")
    return edges


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
    edges = include_edges(set(deps))
    for a in sorted(deps):
        for b in sorted(deps[a]):
            if (a, b) not in edges:
                problems.append(f"src/{a}/CMakeLists.txt declares cedar_{b} but no file of {a} includes {b}: "
                                f"drop it, so the declarations stay the DAG")
    for (a, b), where in sorted(edges.items()):
        if b not in deps[a]:
            problems.append(f"{a} includes {b} ({where[0]}{' and %d more' % (len(where) - 1) if len(where) > 1 else ''}) "
                            f"but src/{a}/CMakeLists.txt does not declare cedar_{b}: declare it, if the edge belongs "
                            f"in the DAG, or move the code")
    for p in problems:
        print("check_deps: " + p)
    if "--print" in sys.argv and order:
        for m in order:
            print(f"{m:<10} <- {' '.join(sorted(deps[m])) or '(nothing)'}")
    if not problems:
        print(f"check_deps: {len(deps)} modules, every include edge declared, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
