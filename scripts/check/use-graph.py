#!/usr/bin/env python3
"""Fails when files of one crate import each other in a circle, and prints the circle.

For every crate root (src/lib.rs, src/main.rs, src/bin/*.rs) the module tree is read from its
`mod` declarations, and every path that names another file of the same crate (`crate::`,
`super::`, `self::`, or a child module's name; in `use` trees and in code, tests included) is an
edge from the file that writes it to the file that defines the item. A name a module only
re-exports (`pub use`) is followed to the file that defines it, so a facade `mod.rs` is no
circle by itself. `mod x;` alone is no edge. Comments and string literals are ignored.

Usage: scripts/check/use-graph.py [--allow CRATE_DIR]... [CRATE_DIR ...]
       scripts/check/use-graph.py --self-test
CRATE_DIR defaults to every workspace member. A crate named with --allow has its circles printed
but they do not fail the check (for circles known and not yet taken apart). Exit status 1 when
a circle is found in any other crate (or the self-test fails), 2 on a usage error.
"""

import os
import re
import sys

# The repository this script is in (scripts/check/..).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ITEM = re.compile(
    r"\b(?:struct|enum|union|trait|type|fn|const|static|mod|macro_rules!)\s+(?:r#)?([A-Za-z_]\w*)"
)


def strip(src):
    """The source with comments, string and char literals blanked (line breaks kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if src[i] == "\n" else "")
                    i += 1
        elif re.match(r'b?r(#*)"', src[i:i + 260]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
        elif c == '"' or (c == "b" and src.startswith('b"', i) and not (i and src[i - 1].isalnum())):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]*\}|.)|[^\\'])'", src[i:i + 16])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN = re.compile(r"r#[A-Za-z_]\w*|[A-Za-z_]\w*|::|[{}();,*<>]|\n|[^\sA-Za-z_]")


def tokens(code):
    """(token, line) pairs of stripped code."""
    line, out = 1, []
    for m in TOKEN.finditer(code):
        t = m.group(0)
        if t == "\n":
            line += 1
            continue
        out.append((t[2:] if t.startswith("r#") else t, line))
    return out


class Module:
    def __init__(self, path, file, parent):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.children = {}  # name -> Module
        self.items = set()
        self.reexports = {}  # name -> (absolute path tuple)
        self.globs = []  # absolute module paths re-exported with *
        self.refs = []  # (absolute path tuple, line, text)


def use_paths(toks, i):
    """Parses `use TREE;` from toks[i] (just after `use`); returns ([(segments, glob)], next i)."""
    result = []

    def tree(i, prefix):
        segs = list(prefix)
        while i < len(toks):
            t = toks[i][0]
            if t == "{":
                i += 1
                while toks[i][0] != "}":
                    i = tree(i, segs)
                    if toks[i][0] == ",":
                        i += 1
                return i + 1
            if t == "*":
                result.append((segs, True))
                return i + 1
            if t == "::":
                i += 1
                continue
            if re.match(r"[A-Za-z_]", t):
                segs.append(t)
                i += 1
                if i < len(toks) and toks[i][0] == "as":
                    i += 2
                if i < len(toks) and toks[i][0] != "::":
                    result.append((segs, False))
                    return i
                continue
            result.append((segs, False))
            return i
        return i

    i = tree(i, [])
    while i < len(toks) and toks[i][0] != ";":
        i += 1
    return result, i + 1


def child_file(directory, name):
    for cand in (os.path.join(directory, name + ".rs"), os.path.join(directory, name, "mod.rs")):
        if os.path.isfile(cand):
            return cand
    return None


def load(root_file):
    """Reads the module tree below one crate root; returns (modules by path, problems)."""
    modules, problems = {}, []

    def read_file(mod, file, directory):
        with open(file, encoding="utf-8") as f:
            toks = tokens(strip(f.read()))
        scan(mod, toks, 0, len(toks), file, directory)

    def scan(mod, toks, i, end, file, directory):
        mod.items.update(ITEM.findall(" ".join(t for t, _ in toks[i:end])))
        public = False
        while i < end:
            t, line = toks[i]
            if t == "mod" and i + 2 < end and re.match(r"[A-Za-z_]", toks[i + 1][0]):
                name, nxt = toks[i + 1][0], toks[i + 2][0]
                if nxt == ";":
                    f = child_file(directory, name)
                    if f is None:
                        problems.append(f"{file}:{line}: no file for `mod {name};`")
                    else:
                        child = add(mod, name, f)
                        read_file(child, f, os.path.dirname(f) if f.endswith("mod.rs") else f[:-3])
                    i += 3
                    continue
                if nxt == "{":
                    close, depth = i + 2, 0
                    while close < end:
                        depth += {"{": 1, "}": -1}.get(toks[close][0], 0)
                        if depth == 0:
                            break
                        close += 1
                    child = add(mod, name, file)
                    scan(child, toks, i + 3, close, file, os.path.join(directory, name))
                    i = close + 1
                    continue
            if t == "use" and i + 1 < end and toks[i + 1][0] != "<":
                paths, i = use_paths(toks, i + 1)
                for segs, glob in paths:
                    absolute = resolve_start(mod, segs)
                    if absolute is None:
                        continue
                    mod.refs.append((absolute, line, "::".join(segs) + ("::*" if glob else "")))
                    if public:
                        if glob:
                            mod.globs.append(absolute)
                        elif segs[-1] != "self":
                            mod.reexports[segs[-1]] = absolute
                public = False
                continue
            public = t == "pub" or (public and t in ("(", ")", "crate", "super", "in"))
            if t in ("crate", "super", "self") or (t in mod.children and (i == 0 or toks[i - 1][0] != "::")):
                if i + 1 < end and toks[i + 1][0] == "::":
                    segs, j = [t], i + 1
                    while j + 1 < end and toks[j][0] == "::" and re.match(r"[A-Za-z_]", toks[j + 1][0]):
                        segs.append(toks[j + 1][0])
                        j += 2
                    absolute = resolve_start(mod, segs)
                    if absolute is not None:
                        mod.refs.append((absolute, line, "::".join(segs)))
                    i = j
                    continue
            i += 1

    def add(parent, name, file):
        child = Module(parent.path + (name,), file, parent)
        parent.children[name] = child
        modules[child.path] = child
        return child

    root = Module((), root_file, None)
    modules[()] = root
    read_file(root, root_file, os.path.dirname(root_file))
    return modules, problems


def resolve_start(mod, segs):
    """The absolute path `segs` names from module `mod`, or None when it leaves the crate."""
    base, rest = None, list(segs)
    if not rest:
        return None
    if rest[0] == "crate":
        base, rest = (), rest[1:]
    elif rest[0] in ("self", "super"):
        base = mod.path
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif rest[0] in mod.children:
        base = mod.path
    if base is None:
        return None
    return tuple(base) + tuple(rest)


def target(modules, absolute, seen=None):
    """The module that defines what `absolute` names, following re-exports."""
    seen = seen or set()
    prefix = list(absolute)
    while tuple(prefix) not in modules:
        prefix.pop()
    mod = modules[tuple(prefix)]
    rest = absolute[len(prefix):]
    if not rest or rest[0] in mod.items or (mod.path, rest[0]) in seen:
        return mod
    seen.add((mod.path, rest[0]))
    if rest[0] in mod.reexports:
        return target(modules, mod.reexports[rest[0]] + tuple(rest[1:]), seen)
    for g in mod.globs:
        if g in modules:
            found = target(modules, g + tuple(rest), seen)
            if found is not modules[g] or rest[0] in found.items:
                return found
    return mod


def edges(modules):
    """Two graphs, each node -> {node: (file, line, text) of the first reference}: between files,
    and between sibling modules (a module standing for everything below it: `a::x` using
    `b::y` is `a` using `b`; a module using its own ancestor or descendant is no sibling edge)."""
    files, siblings = {}, {}
    for mod in modules.values():
        for absolute, line, text in mod.refs:
            dest = target(modules, absolute)
            if dest.file != mod.file:
                files.setdefault(mod.file, {}).setdefault(dest.file, (mod.file, line, text))
            common = 0
            while common < min(len(mod.path), len(dest.path)) and mod.path[common] == dest.path[common]:
                common += 1
            if common < len(mod.path) and common < len(dest.path):
                a, b = "::".join(mod.path[: common + 1]), "::".join(dest.path[: common + 1])
                siblings.setdefault(a, {}).setdefault(b, (mod.file, line, text))
    return files, siblings


def cycles(graph):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def shortest_loop(graph, comp):
    """One shortest circle through the first file of a component, as a list of files."""
    members, start = set(comp), comp[0]
    prev, queue = {start: None}, [start]
    for v in queue:
        for w in sorted(graph.get(v, {})):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def report(graph, kind, name, repo):
    """One text per circle of `graph`: its members and one shortest loop with the lines."""
    found = []
    for comp in cycles(graph):
        loop = shortest_loop(graph, comp)
        lines = []
        for a, b in zip(loop, loop[1:]):
            file, line, text = graph[a][b]
            lines.append(f"    {os.path.relpath(file, repo)}:{line} uses {text} ({name(b)})")
        names = ", ".join(name(m) for m in comp)
        found.append(f"  circle of {len(comp)} {kind}: {names}\n  for example:\n" + "\n".join(lines))
    return found


def crate_roots(crate):
    src = os.path.join(crate, "src")
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src, f))]
    bins = os.path.join(src, "bin")
    if os.path.isdir(bins):
        for f in sorted(os.listdir(bins)):
            p = os.path.join(bins, f)
            roots.append(p if f.endswith(".rs") else os.path.join(p, "main.rs"))
    return [r for r in roots if os.path.isfile(r)]


def workspace_members(repo):
    with open(os.path.join(repo, "Cargo.toml"), encoding="utf-8") as f:
        m = re.search(r"members\s*=\s*\[([^\]]*)\]", f.read())
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def check(repo, crate):
    """The circles of one crate (files and sibling modules), each as printable text."""
    path = crate if os.path.isabs(crate) else os.path.join(repo, crate)
    found = []
    for root in crate_roots(path):
        modules, problems = load(root)
        found += [f"  {os.path.relpath(p, repo)}" for p in problems]
        files, siblings = edges(modules)
        found += report(files, "files", lambda f: os.path.relpath(f, repo), repo)
        found += report(siblings, "modules", lambda m: "crate::" + m, repo)
    return found


def self_test():
    """The check on small crates written here: a circle is found, a facade and tests are not."""
    import tempfile

    crates = {
        "circle": {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use crate::b::B;\npub struct A(pub B);\n",
            "b.rs": "pub struct B;\npub fn f() -> usize { std::mem::size_of::<crate::a::A>() }\n",
        },
        "through_code": {
            "lib.rs": "mod plan;\nmod ledger;\n",
            "plan/mod.rs": "mod admit;\npub use admit::Admission;\npub struct View;\n"
            "pub fn run() -> impl Sized + use<> { crate::ledger::count() }\n",
            "plan/admit.rs": "pub struct Admission;\n",
            "ledger.rs": "/* crate::plan::nothing */ pub fn count() -> usize { let s = \"crate::plan::x\"; s.len() }\n"
            "#[cfg(test)]\nmod tests { fn v() -> crate::plan::View { crate::plan::View } }\n",
        },
        "facade": {
            "lib.rs": "mod plan;\nmod ledger;\n",
            "plan/mod.rs": "mod admit;\nmod inputs;\npub use admit::Admission;\npub use inputs::*;\n"
            "// crate::ledger::count\npub fn run() -> usize { let _ = \"crate::ledger::count\"; admit::go() }\n",
            "plan/admit.rs": "use super::View;\npub struct Admission(pub View);\npub fn go() -> usize { 0 }\n",
            "plan/inputs.rs": "pub struct View;\npub fn all() -> impl Iterator<Item = View> + use<> { None.into_iter() }\n",
            "ledger.rs": "use crate::plan::{Admission, View};\n"
            "pub fn count() -> usize { std::mem::size_of::<(Admission, View)>() }\n",
        },
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, files in crates.items():
            for rel, text in files.items():
                path = os.path.join(tmp, name, "src", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
        circle = check(tmp, "circle")
        if not any("src/a.rs:1 uses crate::b::B" in c and "src/b.rs:2 uses crate::a::A" in c for c in circle):
            failures.append(f"a <-> b not found: {circle}")
        code = check(tmp, "through_code")
        if not any("crate::ledger, crate::plan" in c for c in code):
            failures.append(f"plan <-> ledger (a path in code, a test module) not found: {code}")
        if check(tmp, "facade"):
            failures.append(f"a facade, comments or strings taken for a circle: {check(tmp, 'facade')}")
    for f in failures:
        print(f"self-test: {f}")
    print("self-test: " + ("failed" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    repo = REPO
    if argv == ["--self-test"]:
        return self_test()
    allowed, crates = set(), []
    while argv:
        if argv[0] == "--allow" and len(argv) > 1:
            allowed.add(argv[1].rstrip("/"))
            argv = argv[2:]
        elif argv[0].startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            crates.append(argv[0].rstrip("/"))
            argv = argv[1:]
    failed = False
    for crate in crates or workspace_members(repo):
        found = check(repo, crate)
        if not found:
            print(f"{crate}: no import circle")
            continue
        known = crate in allowed
        failed = failed or not known
        print(f"{crate}: {len(found)} import circle(s)" + (" (allowed for now: --allow)" if known else ""))
        print("\n".join(found))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
