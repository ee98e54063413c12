#!/usr/bin/env python3
"""Fails when a module imports one of a higher layer of its crate, or when the layers written
here fall behind the folders; with --report, prints the shape of the tree instead.

LAYERS below holds, for each crate whose folders ARCHITECTURE.md layers, its top-level modules,
top layer first: a module may use the modules of its own layer and of those after it. The
import graph is scripts/check/use-graph.py's (paths in `use` trees and code, re-exports followed
to the defining file; comments, strings and `mod x;` are no edges; tests inside a file count,
integration tests under tests/ are no part of a crate's module tree). A path through a higher
module's re-export counts as using that module: it still depends on it being there. The check
fails on
  * an import from a lower layer up (file:line, the path, and the two modules),
  * a top-level module of a layered crate in no layer (a new or renamed folder: write down its
    place, here and in ARCHITECTURE.md's tables),
  * a layer naming a module the crate does not have, or a crate that is no workspace member.

Usage: scripts/check/layers.py               (the repository this script is in)
       scripts/check/layers.py --self-test
       scripts/check/layers.py --report [--top N] [REPO]
--report prints, as a table to paste into a note, the files per crate and folder, the longest
chain of imports between files of a crate, every import up a layer and the N (15) largest .rs
files, and exits 0; REPO defaults to this work tree (point it at another checkout, e.g. one
made by `git worktree add`, for a before/after). Exit status 1 when the check finds a problem
(each printed on its own line) or the self-test fails, 2 on a usage error.
"""

import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("use_graph", os.path.join(HERE, "use-graph.py"))
use_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(use_graph)

# Top-level modules of a crate, top layer first; the modules of one entry share a layer.
LAYERS = {
    "operator": [
        ["wiring"],
        ["controller", "model"],
        ["writes"],
        ["context"],
        ["watch"],
        ["recall"],
        ["job"],
        ["plan"],
        ["metrics", "telemetry"],
        ["error"],
    ],
    "node-agent": [
        ["cmd"],
        ["daemon"],
        ["pod_check", "bench"],
        ["secrets"],
    ],
    "engines": [
        ["golden"],
        ["pipeline"],
        ["metrics"],
        ["backend"],
        ["host"],
    ],
}
# Test scaffolding at a crate's top is no layer of it.
UNLAYERED = {"tests", "test_support"}


def layer_of(layers, path):
    for i, names in enumerate(layers):
        if path and path[0] in names:
            return i
    return None


def upward(modules, layers, repo):
    """(file:line, text, from module, to module) for each import from a lower layer up."""
    out = []
    for mod in modules.values():
        for absolute, line, text in mod.refs:
            dest = use_graph.target(modules, absolute)
            a = layer_of(layers, mod.path)
            for b, to in ((layer_of(layers, dest.path), dest.path), (layer_of(layers, absolute), absolute)):
                if a is not None and b is not None and b < a:
                    out.append((f"{os.path.relpath(mod.file, repo)}:{line}", text, mod.path[0], to[0]))
                    break
    return out


def problems(repo, all_layers):
    """Each problem of the crates in `all_layers` ({crate: layers}), as a printable line."""
    found = []
    members = use_graph.workspace_members(repo)
    for crate, layers in sorted(all_layers.items()):
        if crate not in members:
            found.append(f"{crate}: no workspace member; remove or rename it in LAYERS of scripts/check/layers.py")
            continue
        named = {n for names in layers for n in names}
        tops = set()
        for root in use_graph.crate_roots(os.path.join(repo, crate)):
            modules, _ = use_graph.load(root)
            tops |= {m.path[0] for m in modules.values() if m.path}
            for where, text, a, b in upward(modules, layers, repo):
                found.append(f"{where}: {text} is a use of {b} from {a}, a lower layer of {crate}")
        for name in sorted(tops - named - UNLAYERED):
            found.append(f"{crate}: module {name} is in no layer; add it to LAYERS in scripts/check/layers.py "
                         "and to ARCHITECTURE.md's tables")
        for name in sorted(named - tops):
            found.append(f"{crate}: LAYERS in scripts/check/layers.py names {name}, which is no module of the crate")
    return found


# ---- --report


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
            if w in seen:  # a circle: use-graph.py reports it; do not loop here
                continue
            chain = [v] + longest(w, seen | {w})
            if len(chain) > len(best):
                best = chain
        memo[v] = best
        return best

    return max((longest(v, {v}) for v in sorted(graph)), key=len, default=[])


def report(repo, top):
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
            if crate not in LAYERS:
                continue
            up = upward(modules, LAYERS[crate], repo)
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


# ---- --self-test

CLEAN = {
    "Cargo.toml": '[workspace]\nmembers = ["a"]\n',
    "a/src/lib.rs": "pub mod top;\npub mod mid;\npub mod low;\n#[cfg(test)]\nmod tests {}\n",
    "a/src/top.rs": "use crate::mid::M;\npub fn f() -> M { crate::low::g(); M }\n",
    "a/src/mid.rs": "pub use crate::low::L;\npub struct M;\n// crate::top::f\n",
    "a/src/low.rs": "pub struct L;\npub fn g() {}\n",
}
CLEAN_LAYERS = {"a": [["top"], ["mid"], ["low"]]}

# (what must be caught, files changed, layers (None: CLEAN_LAYERS), words the one problem holds)
CASES = [
    ("a clean tree passes", {}, None, None),
    ("an import up a layer",
     {"a/src/low.rs": "pub struct L;\npub fn g() -> usize { std::mem::size_of::<crate::mid::M>() }\n"}, None,
     "a/src/low.rs:2: crate::mid::M is a use of mid from low"),
    ("a use through a higher module's re-export",
     {"a/src/low.rs": "pub struct L;\npub fn g() {}\npub fn h() -> crate::mid::L { L }\n"}, None,
     "a/src/low.rs:3: crate::mid::L is a use of mid from low"),
    ("a module in no layer", {"a/src/lib.rs": CLEAN["a/src/lib.rs"] + "pub mod extra;\n", "a/src/extra.rs": ""},
     None, "a: module extra is in no layer"),
    ("a layer naming no module", {}, {"a": [["top"], ["mid", "gone"], ["low"]]}, "names gone, which is no module"),
    ("a crate that is no member", {}, {**CLEAN_LAYERS, "b": [["x"]]}, "b: no workspace member"),
]


def self_test():
    failures = []
    for what, change, layers, want in CASES:
        with tempfile.TemporaryDirectory() as repo:
            for rel, text in {**CLEAN, **change}.items():
                os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
                with open(os.path.join(repo, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            got = problems(repo, layers or CLEAN_LAYERS)
        if (want is None and got) or (want is not None and (len(got) != 1 or want not in got[0])):
            failures.append(f"{what}: got {got}")
    for f in failures:
        print(f"self-test: {f}")
    print(f"self-test: {'failed' if failures else 'ok'} ({len(CASES)} cases)")
    return 1 if failures else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if argv[:1] == ["--report"]:
        argv, top = argv[1:], 15
        if argv[:1] == ["--top"] and len(argv) > 1 and argv[1].isdigit():
            top, argv = int(argv[1]), argv[2:]
        if len(argv) > 1 or (argv and argv[0].startswith("-")):
            print(__doc__, file=sys.stderr)
            return 2
        return report(os.path.abspath(argv[0]) if argv else use_graph.REPO, top)
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    found = problems(use_graph.REPO, LAYERS)
    if found:
        print(f"{len(found)} problem(s) with the layers of {', '.join(sorted(LAYERS))}:")
        print("\n".join(found))
        return 1
    print(f"every import runs down a layer, and every module has its layer: {', '.join(sorted(LAYERS))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
