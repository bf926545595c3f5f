#!/usr/bin/env python3
"""The module DAG, checked: every include edge between src/ modules must be a dependency its CMake file declares.

  scripts/check_deps.py [--print]

The DAG's one source of truth is each module's `cedar_module(cedar_NAME DEPS ...)` in
src/NAME/CMakeLists.txt. A module may sit inside another one's folder (src/ops/linear is the module
ops/linear, target cedar_ops_linear); a file belongs to the innermost module folder holding it, and
`#include "ops/linear/x.h"` names the innermost module whose folder is a prefix of the path. This script
reads those declarations and every such include in each module's own files, and fails (exit 1, one
line per problem) when
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
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_][A-Za-z0-9_/.-]*)"')
MODULE = re.compile(r"cedar_module\(\s*cedar_(\w+)\s+DEPS\s+([^)]*)\)", re.S)


def target_of(module):
    """cedar_ops_linear for the module ops/linear."""
    return "cedar_" + module.replace("/", "_")


def declared_deps():
    deps = {}
    for dirpath, dirnames, files in os.walk(SRC):
        dirnames.sort()
        if "CMakeLists.txt" not in files or dirpath == SRC:
            continue
        name = os.path.relpath(dirpath, SRC).replace(os.sep, "/")
        cmake = os.path.join(dirpath, "CMakeLists.txt")
        text = re.sub(r"#.*", "", open(cmake).read())
        m = MODULE.search(text)
        if not m or "cedar_" + m.group(1) != target_of(name):
            sys.exit(f"check_deps: {cmake} has no cedar_module({target_of(name)} DEPS ...)")
        deps[name] = {d for d in m.group(2).split() if d.startswith("cedar_")}
    # cedar_* targets that are no folder of src/ are third-party builds (cedar_xgrammar): not modules.
    module_of_target = {target_of(name): name for name in deps}
    return {name: {module_of_target[d] for d in ds if d in module_of_target} for name, ds in deps.items()}


def module_of_include(path, modules):
    """The innermost module whose folder holds the included file, or None (a third-party header)."""
    best = None
    for m in modules:
        if path.startswith(m + "/") and (best is None or len(m) > len(best)):
            best = m
    return best


def include_edges(modules):
    edges = {}
    for name in modules:
        folder = os.path.join(SRC, name)
        for dirpath, dirnames, files in os.walk(folder):
            # A nested module's files are its own, not this module's.
            here = os.path.relpath(dirpath, SRC).replace(os.sep, "/")
            if here != name and here in modules:
                dirnames[:] = []
                continue
            for f in sorted(files):
                if not f.endswith((".h", ".cc", ".inc")):
                    continue
                path = os.path.join(dirpath, f)
                for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    target = module_of_include(m.group(1), modules) if m else None
                    if target is not None and target != name:
                        edges.setdefault((name, target), []).append(f"{os.path.relpath(path, ROOT)}:{lineno}")
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
            print(f"{m:<15} <- {' '.join(sorted(deps[m])) or '(nothing)'}")
    if not problems:
        print(f"check_deps: {len(deps)} modules, every include edge declared, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
