#!/usr/bin/env python3
"""Fails when a document names a file, a directory or a Rust item of the repository that no
longer exists.

A path is a word of the form `dir/.../name` whose first part is a top-level directory of the
repository (`operator/src/plan/revisions.rs`, `e2e/testdata/specs/`): it must exist as written.
A word ending in `.rs` that does not start at the top (`plan/revisions.rs`, `backend/auto.rs`,
`memory.rs`) must be the end of some file's path in the repository. Words with `$`, `*`, `<` or
`{`, or a placeholder part (`NAME`, `FILE`, ...: `e2e/tests/NAME.sh`) are patterns, not paths,
and are passed over.

A name in backticks that looks like a Rust path (`crate::a::b`, `kiln_crds::backoff`,
`module::function`, `Type::method`, `pipeline::ready::{load, check_against}`) must resolve in the
workspace's module trees (read as scripts/check/use-graph.py reads them): its first segment is a
workspace crate (`kiln_agent`), `crate`/`self`/`super` (in a Rust comment: from the file's own
module), or the name of a module or item defined somewhere in the workspace; each next segment
must be a child module, an item the module defines or re-exports (`pub use`, globs followed), and
after an item (a type) a name defined anywhere in the workspace or written in the type's file (a
method, a variant). A first segment the workspace does not define (`std::`, `kube::`, `Self::`)
is another crate's business and is passed over, so false alarms stay near zero.

Usage: scripts/check/doc-paths.py [DOC ...]   (default: ARCHITECTURE.md)
       scripts/check/doc-paths.py --comments  (the Rust names in every comment of the workspace's
                                               .rs files)
       scripts/check/doc-paths.py --self-test
Exit status 1 when a named path or name is missing (each printed with its line), 0 otherwise.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile

_spec = importlib.util.spec_from_file_location(
    "use_graph", os.path.join(os.path.dirname(os.path.abspath(__file__)), "use-graph.py")
)
use_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(use_graph)

WORD = re.compile(r"[A-Za-z0-9_.$*<>{}-]+(?:/[A-Za-z0-9_.$*<>{}-]*)+|[A-Za-z0-9_]+\.rs\b")
SKIP_DIRS = {".git", "target"}
PLACEHOLDERS = {"NAME", "FILE", "DIR", "PATH", "TEST", "HOST", "REPO", "KEY", "HEX"}


def repo_files(repo):
    """Every file below `repo` (tracked or not, less build output), relative, with '/'."""
    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), repo).replace(os.sep, "/"))
    return out


def missing(repo, doc):
    """(line number, word) of each path `doc` names that does not exist in `repo`."""
    tops = {d for d in os.listdir(repo) if os.path.isdir(os.path.join(repo, d)) and d not in SKIP_DIRS}
    files = repo_files(repo)
    found = []
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        for m in WORD.finditer(line):
            word = m.group(0).rstrip(".,:;")
            if any(c in word for c in "$*<>{}") or line[max(0, m.start() - 3):m.start()] == "://":
                continue
            if any(part.split(".", 1)[0] in PLACEHOLDERS for part in word.split("/")):
                continue
            first = word.split("/", 1)[0]
            if "/" in word and first in tops:
                if not os.path.exists(os.path.join(repo, word)):
                    found.append((number, word))
            elif word.endswith(".rs"):
                if not any(f == word or f.endswith("/" + word) for f in files):
                    found.append((number, word))
    return found


NAME = re.compile(r"^[A-Za-z_]\w*(?:::(?:[A-Za-z_]\w*|\{[\w\s,]+\}))+(?:\(\))?$")
TICKED = re.compile(r"`([^`\n]+)`")
PUB_USE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);")
IDENT = re.compile(r"[A-Za-z_]\w*")


class Index:
    """The workspace's module trees, for resolving names."""

    def __init__(self, repo):
        self.crates = {}  # lib name (kiln_agent) -> (modules, root module)
        self.by_name = {}  # module or item name -> [(modules, module that is / defines it)]
        self.file_module = {}  # file -> (modules, outermost module read from it)
        self.defined = set()  # every item name defined anywhere
        self.words = {}  # file -> identifiers written in it
        for crate in use_graph.workspace_members(repo):
            cdir = os.path.join(repo, crate)
            with open(os.path.join(cdir, "Cargo.toml"), encoding="utf-8") as f:
                m = re.search(r'^name\s*=\s*"([^"]+)"', f.read(), re.M)
            lib = (m.group(1) if m else crate).replace("-", "_")
            for root in use_graph.crate_roots(cdir):
                modules, _ = use_graph.load(root)
                if root.endswith(os.path.join("src", "lib.rs")):
                    self.crates[lib] = (modules, modules[()])
                for mod in modules.values():
                    with open(mod.file, encoding="utf-8") as f:
                        text = f.read()
                    # A name re-exported from another crate is the module's too.
                    for use in PUB_USE.findall(use_graph.strip(text)):
                        mod.items.update(IDENT.findall(use.split("::")[-1] if "{" not in use else use))
                    self.words.setdefault(mod.file, set(IDENT.findall(text)))
                    self.file_module.setdefault(os.path.abspath(mod.file), (modules, mod))
                    self.defined.update(mod.items)
                    if mod.path:
                        self.by_name.setdefault(mod.path[-1], []).append((modules, mod))
                    for item in mod.items:
                        self.by_name.setdefault(item, []).append((modules, mod))

    def walk(self, modules, mod, segs, depth=0):
        """Does `segs` name something from module `mod`?"""
        if not segs or depth > 20:
            return bool(not segs)
        s, rest = segs[0], segs[1:]
        if s in mod.children:
            return self.walk(modules, mod.children[s], rest, depth + 1)
        if s in mod.reexports:
            return self.absolute(modules, mod.reexports[s] + tuple(rest), depth + 1)
        if s in mod.items:
            # Only a type (capitalised) has members: a method, a variant, an associated item.
            return not rest or (s[0].isupper() and (rest[0] in self.defined or rest[0] in self.words.get(mod.file, ())))
        return any(g in modules and self.walk(modules, modules[g], segs, depth + 1) for g in mod.globs)

    def absolute(self, modules, path, depth=0):
        prefix = tuple(path)
        while prefix not in modules:
            prefix = prefix[:-1]
        return self.walk(modules, modules[prefix], list(path[len(prefix):]), depth)

    def resolves(self, segs, file=None):
        """True, False, or None when the name is not the workspace's to judge."""
        head = segs[0]
        if head in ("crate", "self", "super"):
            if file is None:
                return any(self.walk(m, root, segs[1:]) for m, root in self.crates.values()) if head == "crate" else None
            found = self.file_module.get(os.path.abspath(file))
            if found is None:
                return None
            modules, mod = found
            start = use_graph.resolve_start(mod, segs)
            return None if start is None else self.absolute(modules, start)
        if head == "Self":
            return None
        if head in self.crates:
            modules, root = self.crates[head]
            return self.walk(modules, root, segs[1:])
        candidates = self.by_name.get(head, [])
        if not candidates:
            return None
        for modules, mod in candidates:
            if mod.path and mod.path[-1] == head and self.walk(modules, mod, segs[1:]):
                return True
            if head in mod.items and self.walk(modules, mod, segs):
                return True
        return False


def names_in(text):
    """Each backticked Rust-path-looking name in `text`, with `{a, b}` groups expanded."""
    for m in TICKED.finditer(text):
        word = m.group(1).strip()
        if not NAME.match(word):
            continue
        word = word.removesuffix("()")
        group = re.search(r"::\{([\w\s,]+)\}$", word)
        if group:
            base = word[: group.start()]
            for part in group.group(1).split(","):
                if part.strip():
                    yield word, (base + "::" + part.strip()).split("::")
        elif "{" not in word:
            yield word, word.split("::")


def stale_names(index, lines, file=None):
    """(line number, name) of each name in `lines` that does not resolve."""
    found = []
    for number, line in enumerate(lines, 1):
        for word, segs in names_in(line):
            if any(len(x) == 1 and x.isupper() or x in PLACEHOLDERS for x in segs):
                continue  # `compiled_target::X`: a pattern, not a name
            if index.resolves(segs, file) is False:
                found.append((number, "::".join(segs) if "{" in word else word))
    return found


def comment_lines(path):
    """The file's lines, each blanked but for a `//` comment that starts it."""
    with open(path, encoding="utf-8") as f:
        return [line if line.lstrip().startswith("//") else "" for line in f.read().splitlines()]


def rust_files(repo):
    for crate in use_graph.workspace_members(repo):
        for root, dirs, files in os.walk(os.path.join(repo, crate)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(root, f)


def self_test():
    failures = []
    with tempfile.TemporaryDirectory() as repo:
        os.makedirs(os.path.join(repo, "operator/src/plan"))
        open(os.path.join(repo, "operator/src/plan/revisions.rs"), "w").close()
        doc = os.path.join(repo, "DOC.md")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(
                "in `operator/src/plan/revisions.rs` (`plan/revisions.rs`, `revisions.rs`), `operator/src/`\n"
                "gone: `operator/src/plan/rollout.rs`, and `rollout.rs`; kiln.dev/v1alpha1, kiln/agent-gpu,\n"
                "https://example.com/operator/x.rs, `$REPO/target/release`, `operator/src/*.rs`, operator/NAME.rs\n"
            )
        got = missing(repo, doc)
        want = [(2, "operator/src/plan/rollout.rs"), (2, "rollout.rs")]
        if got != want:
            failures.append(f"paths: {got}, expected {want}")
    with tempfile.TemporaryDirectory() as repo:
        files = {
            "Cargo.toml": '[workspace]\nmembers = ["a"]\n',
            "a/Cargo.toml": '[package]\nname = "kiln-a"\n',
            "a/src/lib.rs": "pub mod plan;\npub use plan::Thing;\n",
            "a/src/plan/mod.rs": "//! Uses [`crate::plan::Thing::go`], `self::rows::row` and `super::plan::gone`.\n"
            "pub mod rows;\npub use kiln_b::Outside;\npub struct Thing;\nimpl Thing { pub fn go() {} }\n"
            "pub enum Kind { One }\n",
            "a/src/plan/rows.rs": "// `rows::row`, `plan::rows::row`, `rows::nothing`\npub fn row() {}\n",
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
            with open(os.path.join(repo, rel), "w", encoding="utf-8") as f:
                f.write(text)
        index = Index(repo)
        lines = [
            "`plan::Thing::go`, `kiln_a::plan::Kind::One`, `kiln_a::Thing`, `plan::Outside`, `Thing::go()`",
            "`std::io::Error`, `kube::Api`, `Self::x`, `plan::X`, `plan::rows::{row}`, `a::b` c::d, `x < y::z`",
            "`plan::gone`, `Thing::nothing`, `kiln_a::plan::Missing`, `plan::{Thing, absent}`",
        ]
        got = stale_names(index, lines)
        want = [(3, "plan::gone"), (3, "Thing::nothing"), (3, "kiln_a::plan::Missing"), (3, "plan::absent")]
        if got != want:
            failures.append(f"names: {got}, expected {want}")
        got = [(os.path.relpath(f, repo), n, w) for f in rust_files(repo) for n, w in stale_names(index, comment_lines(f), f)]
        want = [("a/src/plan/mod.rs", 1, "super::plan::gone"), ("a/src/plan/rows.rs", 1, "rows::nothing")]
        if got != want:
            failures.append(f"comments: {got}, expected {want}")
    for f in failures:
        print(f"self-test: {f}")
    print("self-test: " + ("failed" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    repo = use_graph.REPO
    if argv == ["--self-test"]:
        return self_test()
    index = Index(repo)
    if argv == ["--comments"]:
        gone = []
        for path in rust_files(repo):
            gone += [(os.path.relpath(path, repo), n, w) for n, w in stale_names(index, comment_lines(path), path)]
        for rel, number, word in gone:
            print(f"{rel}:{number}: a comment names {word}, which does not exist")
        print(f"Rust comments: {'every' if not gone else len(gone)} named item{'' if not gone else '(s) missing'}"
              + (" exists" if not gone else ""))
        return 1 if gone else 0
    failed = False
    for doc in argv or ["ARCHITECTURE.md"]:
        path = doc if os.path.isabs(doc) else os.path.join(repo, doc)
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        gone = sorted(missing(repo, path) + stale_names(index, lines))
        for number, word in gone:
            print(f"{doc}:{number}: names {word}, which does not exist")
        print(f"{doc}: {'every' if not gone else len(gone)} named path and name{'' if not gone else '(s) missing'}"
              + (" exists" if not gone else ""))
        failed = failed or bool(gone)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
