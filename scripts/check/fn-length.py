#!/usr/bin/env python3
"""Fails when a non-test function of a crate is longer than the limit, and lists each one.

Every `.rs` file under each crate's src/ is read with comments and string literals blanked (the
same reader as use-graph.py). A function is `fn NAME` with a body; its length is from the
line of `fn` to the line of its closing brace. Functions inside an item marked `#[cfg(test)]`
(the tests module) and functions marked `#[test]` or `#[tokio::test]` are not counted, nor is
anything under tests/ or benches/.

Usage: scripts/check/fn-length.py [--max LINES] [--allow FILE::NAME]... [CRATE_DIR ...]
       scripts/check/fn-length.py --self-test
CRATE_DIR defaults to every workspace member; LINES to 100. A function named with --allow
(`engines/src/metrics.rs::register`) is listed but does not fail the check, for ones known
and not yet split; an --allow that no longer names a long function fails, so the list only
shrinks. Exit status 1 on a failure, 2 on a usage error.
"""

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("use_graph", os.path.join(HERE, "use-graph.py"))
use_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(use_graph)


def closing(toks, i):
    """Index of the `}` that closes the `{` at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        depth += {"{": 1, "}": -1}.get(toks[j][0], 0)
        if depth == 0:
            return j
    return len(toks) - 1


def test_spans(toks):
    """(first, last) token ranges of items marked `#[cfg(test)]`, `#[test]` or `#[tokio::test]`."""
    spans, i = [], 0
    while i < len(toks):
        if toks[i][0] == "#" and i + 1 < len(toks) and toks[i + 1][0] == "[":
            j, depth, words = i + 1, 0, []
            while j < len(toks):
                depth += {"[": 1, "]": -1}.get(toks[j][0], 0)
                words.append(toks[j][0])
                if depth == 0:
                    break
                j += 1
            attr = "".join(words)
            if attr in ("[cfg(test)]", "[test]", "[tokio::test]") or attr.startswith("[tokio::test("):
                k = j + 1
                while k < len(toks) and toks[k][0] not in ("{", ";"):
                    k += 1
                if k < len(toks) and toks[k][0] == "{":
                    spans.append((i, closing(toks, k)))
            i = j + 1
            continue
        i += 1
    return spans


def functions(path):
    """(name, first line, lines) of every function with a body in one file, tests left out."""
    with open(path, encoding="utf-8") as f:
        toks = use_graph.tokens(use_graph.strip(f.read()))
    spans = test_spans(toks)
    found = []
    for i, (t, line) in enumerate(toks):
        if t != "fn" or i + 1 >= len(toks) or not toks[i + 1][0][:1].isidentifier():
            continue
        if any(a <= i <= b for a, b in spans):
            continue
        k, parens = i + 2, 0
        while k < len(toks):
            tk = toks[k][0]
            parens += {"(": 1, ")": -1}.get(tk, 0)
            if parens == 0 and tk in ("{", ";"):
                break
            k += 1
        if k >= len(toks) or toks[k][0] == ";":
            continue  # a declaration without a body
        end = closing(toks, k)
        found.append((toks[i + 1][0], line, toks[end][1] - line + 1))
    return found


def long_functions(repo, crate, limit):
    """`(FILE::NAME, line, lines)` of the crate's functions over `limit` lines."""
    src = os.path.join(repo, crate, "src")
    out = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, repo)
            out += [(f"{rel}::{fn}", line, n) for fn, line, n in functions(path) if n > limit]
    return sorted(out)


def check(repo, crates, limit, allowed):
    """Printed lines and whether the check failed."""
    lines, failed, seen = [], False, set()
    for crate in crates:
        for name, line, n in long_functions(repo, crate, limit):
            seen.add(name)
            known = name in allowed
            failed = failed or not known
            note = " (allowed for now: --allow)" if known else ""
            lines.append(f"{name.split('::')[0]}:{line} {name.split('::')[1]}: {n} lines{note}")
    for name in sorted(allowed - seen):
        if any(name.startswith(c.rstrip("/") + "/") for c in crates):
            failed = True
            lines.append(f"{name}: --allow names no function over {limit} lines; drop it from the list")
    if not lines:
        lines.append(f"no non-test function over {limit} lines")
    return lines, failed


def self_test():
    """The check on a small crate written here: a long function is found, tests are not."""
    import tempfile

    body = "    let _ = 1;\n" * 5
    files = {
        "src/lib.rs": "mod a;\npub fn long() {\n" + body + "}\n"
        "pub fn short() { let s = \"fn fake() {\"; let f: fn(u8) -> u8 = |x| x; }\n"
        "pub trait T { fn declared(&self) -> u8; fn provided(&self) -> u8 {\n" + body + "0 } }\n",
        "src/a.rs": "pub fn fine() {}\n#[cfg(test)]\nmod tests {\n    fn helper() {\n" + body + "    }\n"
        "    #[test]\n    fn a_test() {\n" + body + "    }\n}\n"
        "#[tokio::test(flavor = \"multi_thread\")]\nasync fn outside() {\n" + body + "}\n"
        "pub fn where_clause<T>(t: T) -> usize\nwhere\n    T: Fn(u8) -> u8,\n{\n" + body + "0\n}\n",
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            path = os.path.join(tmp, "c", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        got = {(n, lines) for n, _, lines in long_functions(tmp, "c", 4)}
        want = {("c/src/lib.rs::long", 7), ("c/src/lib.rs::provided", 7), ("c/src/a.rs::where_clause", 11)}
        if got != want:
            failures.append(f"found {sorted(got)}, expected {sorted(want)}")
        _, failed = check(tmp, ["c"], 4, {n for n, _ in want})
        if failed:
            failures.append("failed although every long function is allowed")
        _, failed = check(tmp, ["c"], 4, {n for n, _ in want} | {"c/src/a.rs::fine"})
        if not failed:
            failures.append("an --allow of a short function did not fail")
        _, failed = check(tmp, ["c"], 4, set())
        if not failed:
            failures.append("long functions not allowed did not fail")
    for f in failures:
        print(f"self-test: {f}")
    print("self-test: " + ("failed" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    repo = use_graph.REPO
    if argv == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(usage=__doc__.split("Usage: ")[1].split("\n\n")[0])
    parser.add_argument("--max", type=int, default=100)
    parser.add_argument("--allow", action="append", default=[])
    parser.add_argument("crates", nargs="*")
    args = parser.parse_args(argv)
    if any("::" not in a for a in args.allow):
        parser.error("--allow takes FILE::NAME")
    crates = [c.rstrip("/") for c in args.crates] or use_graph.workspace_members(repo)
    lines, failed = check(repo, crates, args.max, set(args.allow))
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
