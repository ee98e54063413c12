#!/usr/bin/env python3
"""Prints the shape of the tree, as a table to paste into a note: files per crate and folder, the
longest chain of imports between files of a crate, the largest files, and every import that runs
from a lower layer of a crate up to a higher one (the layers ARCHITECTURE.md states, listed in
LAYERS below, top first).

The import graph is scripts/check-use-graph.py's (paths in `use` trees and code, re-exports
followed to the defining file; comments, strings and `mod x;` are no edges). Tests inside a file
count; integration tests (`tests/`) are not part of a crate's module tree.

Usage: scripts/layout-report.py [--top N] [REPO]   (REPO defaults to this work tree; point it at
       another checkout, e.g. one made by `git worktree add`, for a before/after)
Exit status 0; it reports, it does not judge (check-use-graph.py fails on circles).
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("use_graph", os.path.join(HERE, "check-use-graph.py"))
use_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(use_graph)

# Top-level modules of a crate, top layer first; a module may use those after it. Modules of one
# entry share a layer; a module named in no layer is not judged. The names the modules had before
# issue 33's restructure stand in their folder's layer, so an older checkout is judged alike.
LAYERS = {
    "node-agent": [
        ["cmd"],
        ["daemon", "run"],
        ["golden", "bench"],
        ["pipeline"],
        ["metrics"],
        ["backend", "tensor", "placement"],
        ["host", "compat", "memory", "device_memory", "host_pid"],
        ["secrets", "error"],
    ],
    "operator": [
        ["wiring", "run"],
        ["controller", "model"],
        ["writes"],
        ["context"],
        ["watch", "lean", "triggers"],
        ["recall", "memo", "lookups", "admission", "pace"],
        ["job", "observe"],
        ["plan", "classes", "readiness"],
        ["metrics", "telemetry"],
        ["error"],
    ],
}


def files_per_folder(repo, crate):
    """(folder relative to the crate's src, .rs files directly in it), sorted."""
    src = os.path.join(repo, crate, "src")
    out = []
    for root, _dirs, files in os.walk(src):
        n = sum(f.endswith(".rs") for f in files)
        out.append((os.path.relpath(root, src), n))
    return sorted(out)


def longest_chain(graph):
    """The longest simple chain of files in an acyclic `graph` (node -> {node: ...})."""
    memo = {}

    def longest(v, seen):
        if v in memo:
            return memo[v]
        best = [v]
        for w in sorted(graph.get(v, {})):
            if w in seen:  # a circle: check-use-graph.py reports it; do not loop here
                continue
            chain = [v] + longest(w, seen | {w})
            if len(chain) > len(best):
                best = chain
        memo[v] = best
        return best

    return max((longest(v, {v}) for v in sorted(graph)), key=len, default=[])


def layer_of(layers, path):
    for i, names in enumerate(layers):
        if path and path[0] in names:
            return i
    return None


def upward(modules, crate, repo):
    """(from file:line, text, from module, to module) for each import from a lower layer up."""
    layers = LAYERS.get(crate)
    if not layers:
        return None
    out = []
    for mod in modules.values():
        for absolute, line, text in mod.refs:
            dest = use_graph.target(modules, absolute)
            a = layer_of(layers, mod.path)
            # The module the path names counts as well as the one that defines the item: a path
            # through a higher module's re-export still depends on that module being there.
            for b, to in ((layer_of(layers, dest.path), dest.path), (layer_of(layers, absolute), absolute)):
                if a is not None and b is not None and b < a:
                    out.append((f"{os.path.relpath(mod.file, repo)}:{line}", text, mod.path[0], to[0]))
                    break
    return out


def main(argv):
    top = 15
    if argv[:1] == ["--top"] and len(argv) > 1:
        top, argv = int(argv[1]), argv[2:]
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__, file=sys.stderr)
        return 2
    repo = os.path.abspath(argv[0]) if argv else os.path.dirname(HERE)
    sizes = []
    for crate in use_graph.workspace_members(repo):
        print(f"## {crate}")
        folders = files_per_folder(repo, crate)
        total = sum(n for _, n in folders)
        print(f"files: {total}; per folder: " + ", ".join(f"{d}/ {n}" for d, n in folders))
        for root in use_graph.crate_roots(os.path.join(repo, crate)):
            modules, _ = use_graph.load(root)
            files, _ = use_graph.edges(modules)
            chain = longest_chain(files)
            if not chain:
                continue
            rel = [os.path.relpath(f, os.path.join(repo, crate, "src")) for f in chain]
            print(f"longest import chain from {os.path.basename(root)}: {len(rel)} files: " + " → ".join(rel))
            up = upward(modules, crate, repo)
            if up is None:
                continue
            print(f"imports from a lower layer up: {len(up)}")
            for where, text, a, b in up:
                print(f"  {where} uses {text} ({a} → {b})")
        for root, _dirs, fs in os.walk(os.path.join(repo, crate)):
            if "/target" in root:
                continue
            for f in fs:
                if f.endswith(".rs"):
                    p = os.path.join(root, f)
                    with open(p, encoding="utf-8") as fh:
                        sizes.append((sum(1 for _ in fh), os.path.relpath(p, repo)))
    print(f"## the {top} largest .rs files (lines)")
    for n, p in sorted(sizes, reverse=True)[:top]:
        print(f"  {n:5d}  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
