#!/usr/bin/env python3
"""Fails when a document names a file or directory of the repository that no longer exists.

A path is a word of the form `dir/.../name` whose first part is a top-level directory of the
repository (`operator/src/plan/revisions.rs`, `e2e/testdata/specs/`): it must exist as written.
A word ending in `.rs` that does not start at the top (`plan/revisions.rs`, `backend/auto.rs`,
`memory.rs`) must be the end of some file's path in the repository. Words with `$`, `*`, `<` or
`{`, or a placeholder part (`NAME`, `FILE`, ...: `e2e/tests/NAME.sh`) are patterns, not paths,
and are passed over.

Usage: scripts/check-doc-paths.py [DOC ...]   (default: ARCHITECTURE.md)
       scripts/check-doc-paths.py --self-test
Exit status 1 when a named path is missing (each printed with its line), 0 otherwise.
"""

import os
import re
import subprocess
import sys
import tempfile

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


def self_test():
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
    print("self-test: " + ("ok" if got == want else f"failed: {got}, expected {want}"))
    return 0 if got == want else 1


def main(argv):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv == ["--self-test"]:
        return self_test()
    failed = False
    for doc in argv or ["ARCHITECTURE.md"]:
        path = doc if os.path.isabs(doc) else os.path.join(repo, doc)
        gone = missing(repo, path)
        for number, word in gone:
            print(f"{doc}:{number}: names {word}, which does not exist")
        print(f"{doc}: {'every' if not gone else len(gone)} named path{'' if not gone else '(s) missing'}"
              + (" exists" if not gone else ""))
        failed = failed or bool(gone)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
