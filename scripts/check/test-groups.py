#!/usr/bin/env python3
"""Fails when a test exists that no run starts, or a run names a test that does not exist.

A test nobody runs proves nothing, and a name nobody can run is a promise broken; both happen
quietly when a file is added or renamed, so this is checked rather than remembered.

e2e: every test in e2e/tests/*.sh (a sourced library is none: lib.sh, *-lib.sh, a file without
`#!`, or one whose opening comment says it is sourced) is in exactly one group array of
e2e/test.sh (`NAME_TESTS=(...)`, mapped to a group by `group_tests`; every group in GROUPS_ALL)
or run by name by the full cycle (`"$E2E/tests/NAME.sh"`), and is executable; every name there
has its file.

Rust: every integration test target of the workspace (tests/NAME.rs, tests/NAME/main.rs,
`[[test]]`) is run by a `cargo test` in the run column of ARCHITECTURE.md's "## Tests, by kind"
table (`--test NAME`, or the crate's `-p` with no `--test`/`--lib` filter) and by a `cargo test`
line of scripts/test.sh; every `--test NAME` the table names exists in its crate; every run the
table gives with `--features` is one scripts/test.sh makes (the workspace run has no features).

Usage: scripts/check/test-groups.py              (the repository this script is in)
       scripts/check/test-groups.py --self-test
Exit status 1 when a problem is found (each printed on its own line, with the fix), 0 otherwise.
"""

import os
import re
import shlex
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field

# ---- e2e


def e2e_runs(text):
    """(arrays {ARRAY: [test]}, groups {ARRAY: group}, GROUPS_ALL, tests run by name)."""
    arrays = {}
    for m in re.finditer(r"^\s*(\w+_TESTS)=\(([^)]*)\)", text, re.M):
        body = re.sub(r"#[^\n]*", "", m.group(2))
        arrays[m.group(1)] = body.split()
    fn = re.search(r"^group_tests\(\)\s*\{(.*?)^\}", text, re.M | re.S)
    groups = {a: g for g, a in re.findall(r"([\w-]+)\)\s*echo\s+\"?\$\{(\w+)\[@\]\}", fn.group(1) if fn else "")}
    m = re.search(r"^\s*GROUPS_ALL=\(([^)]*)\)", text, re.M)
    # The full cycle may run one test twice (down-clean after each down): one place, not two.
    by_name = sorted(set(re.findall(r"\"\$E2E/tests/([\w.-]+)\.sh\"", text)))
    return arrays, groups, (m.group(1).split() if m else []), by_name


def is_library(path):
    """A file that is sourced, not run: by its name, a missing `#!`, or its opening comment."""
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if name == "lib.sh" or name.endswith("-lib.sh") or not lines or not lines[0].startswith("#!"):
        return True
    opening = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        opening.append(line)
    return bool(re.search(r"\b(sourced|source (it )?after)\b", " ".join(opening), re.I))


def e2e_problems(repo):
    """(problems, summary) for e2e/test.sh against e2e/tests/."""
    tdir = os.path.join(repo, "e2e", "tests")
    with open(os.path.join(repo, "e2e", "test.sh"), encoding="utf-8") as f:
        arrays, groups, groups_all, by_name = e2e_runs(f.read())
    files = {n[:-3]: os.path.join(tdir, n) for n in sorted(os.listdir(tdir)) if n.endswith(".sh")}
    tests = {n for n, p in files.items() if not is_library(p)}
    runs = {}  # test -> where it is run
    problems = []
    for array, names in arrays.items():
        if array not in groups:
            problems.append(f"e2e/test.sh: {array} is in no group: "
                            "map it in group_tests and add the group to GROUPS_ALL")
        elif groups[array] not in groups_all:
            problems.append(f"e2e/test.sh: group {groups[array]} is not in GROUPS_ALL: the full cycle never runs it")
        for n in names:
            runs.setdefault(n, []).append(array)
    for n in by_name:
        runs.setdefault(n, []).append("the full cycle, by name")
    for n, where in sorted(runs.items()):
        if n not in files:
            problems.append(f"e2e/test.sh: {', '.join(where)} names {n}, but e2e/tests/{n}.sh does not exist: "
                            f"remove it there or add the test")
        elif n not in tests:
            problems.append(f"e2e/test.sh: {', '.join(where)} names {n}, but e2e/tests/{n}.sh is a sourced library")
        elif not os.access(files[n], os.X_OK):
            problems.append(f"e2e/tests/{n}.sh is run but not executable: chmod +x it")
        if len(runs[n]) > 1:
            problems.append(f"e2e/test.sh: {n} is run more than once ({', '.join(runs[n])}): keep it in one")
    for n in sorted(tests - set(runs)):
        choice = " or ".join(a for a in arrays if a in groups) or "a group array"
        problems.append(f"e2e/tests/{n}.sh is a test no run starts: add {n} to {choice} in e2e/test.sh")
    grouped = sum(len(v) for a, v in arrays.items() if a in groups)
    return problems, f"{grouped} e2e tests in {len(groups)} groups and {len(by_name)} run by name"


# ---- Rust


def rust_targets(repo):
    """{(package, test target): (path, required features)} of every workspace member."""
    with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f).get("workspace", {}).get("members", [])
    targets = {}
    for crate in members:
        with open(os.path.join(repo, crate, "Cargo.toml"), "rb") as f:
            manifest = tomllib.load(f)
        package = manifest["package"]["name"]
        tdir = os.path.join(repo, crate, "tests")
        found = {}
        if manifest["package"].get("autotests", True) and os.path.isdir(tdir):
            for n in sorted(os.listdir(tdir)):
                if n.endswith(".rs"):
                    found[n[:-3]] = (f"{crate}/tests/{n}", set())
                elif os.path.isfile(os.path.join(tdir, n, "main.rs")):
                    found[n] = (f"{crate}/tests/{n}/main.rs", set())
        for t in manifest.get("test", []):
            path = f"{crate}/{t.get('path', 'tests/' + t['name'] + '.rs')}"
            found[t["name"]] = (path, set(t.get("required-features", [])))
        targets.update({(package, n): v for n, v in found.items()})
    return targets


@dataclass
class Run:
    """One `cargo test` command: what it selects."""

    where: str
    text: str
    crates: set = field(default_factory=set)
    workspace: bool = False
    features: set = field(default_factory=set)
    tests: set = field(default_factory=set)
    kinds: set = field(default_factory=set)  # other target filters: --lib, --doc, ...
    no_run: bool = False  # --no-run: builds, runs nothing

    def covers(self, package, name, required=frozenset()):
        selected = self.workspace or package in self.crates
        return selected and (not (self.tests or self.kinds) or name in self.tests) and required <= self.features


def parse_run(command, where):
    """The Run of `cargo test ARGS` (anything before `cargo test` is passed over)."""
    text = command[command.index("cargo test"):].strip()
    try:
        toks = shlex.split(text[len("cargo test"):])
    except ValueError:
        toks = text[len("cargo test"):].split()
    run, it = Run(where, text), iter(toks)
    for t in it:
        key, _, val = t.partition("=")
        if t == "--":
            break
        if key in ("-p", "--package"):
            run.crates.add(val or next(it, ""))
        elif key in ("--workspace", "--all"):
            run.workspace = True
        elif key in ("--features", "-F"):
            run.features.update(x for x in re.split(r"[ ,]+", val or next(it, "")) if x)
        elif key == "--test":
            run.tests.add(val or next(it, ""))
        elif key == "--no-run":
            run.no_run = True
        elif key in ("--lib", "--bins", "--bin", "--doc", "--examples", "--example", "--benches", "--bench"):
            run.kinds.add(key)
    run.workspace = run.workspace or not run.crates
    return run


def split_row(line):
    """The cells of a Markdown table row; a `|` inside backticks stays in its cell."""
    cells, cell, ticked = [], "", False
    for c in line.strip().strip("|"):
        if c == "`":
            ticked = not ticked
        if c == "|" and not ticked:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += c
    return cells + [cell.strip()]


def table_runs(path, heading="## Tests, by kind"):
    """Each `cargo test` in the run column of the table under `heading`; None without one."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if heading not in lines:
        return None
    runs = []
    for number, line in enumerate(lines[lines.index(heading) + 1:], lines.index(heading) + 2):
        if line.startswith("## "):
            break
        if line.startswith("|"):
            for span in re.findall(r"`([^`]*cargo test[^`]*)`", split_row(line)[-1]):
                runs.append(parse_run(span, f"ARCHITECTURE.md:{number}"))
    return [r for r in runs if not r.no_run]


def script_runs(path):
    """Each `cargo test` command of a shell script (comments skipped, `\\` lines joined)."""
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    runs = []
    for number, line in enumerate(text.splitlines(), 1):
        # A command, not a word in a string (`phase "cargo test"`) or a comment.
        for m in re.finditer(r"(?:^|[;&|(])\s*(?:\w+=\S*\s+)*(cargo test\b[^;&|#]*)", line.split(" #")[0]):
            runs.append(parse_run(m.group(1), f"scripts/test.sh:{number}"))
    return [r for r in runs if not r.no_run]


def contains(outer, inner):
    """Does the run `outer` run everything `inner` does, with its features?"""
    crates = outer.workspace or (not inner.workspace and inner.crates <= outer.crates)
    unfiltered = not (outer.tests or outer.kinds)
    targets = unfiltered or ((inner.tests or inner.kinds) and inner.tests <= outer.tests and inner.kinds <= outer.kinds)
    return crates and bool(targets) and inner.features <= outer.features


def rust_problems(repo):
    """(problems, summary) for the workspace's test targets against the table and scripts/test.sh."""
    targets = rust_targets(repo)
    table = table_runs(os.path.join(repo, "ARCHITECTURE.md"))
    if table is None:
        return ["ARCHITECTURE.md has no \"## Tests, by kind\" table"], ""
    script = script_runs(os.path.join(repo, "scripts", "test.sh"))
    packages = {p for p, _ in targets}
    problems = []
    for (package, name), (path, required) in sorted(targets.items()):
        fix = f"cargo test -p {package}{' --features ' + ','.join(sorted(required)) if required else ''} --test {name}"
        if not any(r.covers(package, name, required) for r in table):
            problems.append(f"ARCHITECTURE.md: the tests table runs no {path}: add `{fix}` to a row's run column")
        if not any(r.covers(package, name, required) for r in script):
            problems.append(f"scripts/test.sh runs no {path}: add `{fix}` (or keep `cargo test --workspace`)")
    for run in table:
        for name in sorted(run.tests):
            if not any((p, name) in targets for p in (run.crates if not run.workspace else packages)):
                problems.append(f"{run.where}: `{run.text}` names --test {name}, which is no test target of "
                                f"{', '.join(sorted(run.crates)) or 'the workspace'}: fix the name or the row")
        if run.features and not any(contains(s, run) for s in script):
            problems.append(f"{run.where}: `{run.text}` is run by no line of scripts/test.sh: add it there")
    return problems, f"{len(targets)} Rust test targets, {len(table)} table runs, {len(script)} scripts/test.sh runs"


def check(repo):
    """(problems, summary line) for the repository at `repo`."""
    e2e, e2e_summary = e2e_problems(repo)
    rust, rust_summary = rust_problems(repo)
    return e2e + rust, f"{e2e_summary}; {rust_summary}"


# ---- self-test

CLEAN = {
    "Cargo.toml": '[workspace]\nmembers = ["a", "b"]\n',
    "a/Cargo.toml": '[package]\nname = "kiln-a"\n[features]\nfault = []\n',
    "a/tests/one.rs": "", "a/tests/iso.rs": "", "a/tests/common/mod.rs": "", "a/tests/multi/main.rs": "",
    "b/Cargo.toml": '[package]\nname = "kiln-b"\n',
    "b/tests/x.rs": "",
    "ARCHITECTURE.md": "# A\n\n## Tests, by kind\n\n| kind | what it proves | run |\n|---|---|---|\n"
    "| one | `--log-format plain|json` | `cargo test -p kiln-a --lib --test one --test multi` |\n"
    "| iso | crashes | `cargo test -p kiln-a --features fault --test iso` (root) |\n"
    "| b | all of b | `cargo test -p kiln-b`, `e2e/test.sh --group kiln` |\n"
    "\n## Next\n`cargo test -p kiln-a --test gone`\n",
    "scripts/test.sh": "#!/bin/bash\n# cargo test -p nothing\nphase \"cargo test\"\ncargo test -p kiln-b --no-run\n"
    "cargo test --workspace --locked\n"
    "cargo test -p kiln-a --locked --features fault \\\n  --test iso\n",
    "e2e/test.sh": "#!/bin/bash\nHARNESS_TESTS=(up job)\nKILN_TESTS=(kiln\n  gpu)\nGROUPS_ALL=(harness kiln)\n"
    "group_tests() {\n  case $1 in\n    harness) echo \"${HARNESS_TESTS[@]}\" ;;\n"
    "    kiln) echo \"${KILN_TESTS[@]}\" ;;\n    *) return 1 ;;\n  esac\n}\n"
    "cluster_tests() { step \"$t\" \"$E2E/tests/$t.sh\"; }\nstep down-clean \"$E2E/tests/down-clean.sh\"\n",
    **{f"e2e/tests/{n}.sh": "#!/bin/bash\n# A test.\n" for n in ("up", "job", "kiln", "gpu", "down-clean")},
    "e2e/tests/lib.sh": "# shellcheck shell=bash\n# Helpers.\n",
    "e2e/tests/x-lib.sh": "#!/bin/bash\n# Helpers.\n",
    "e2e/tests/helpers.sh": "#!/bin/bash\n# Helpers for two tests.\n# Sourced after lib.sh.\n",
}

# (what must be caught, files changed (None: removed), words the one problem reported must hold)
CASES = [
    ("a clean tree passes", {}, None),
    ("a test file in no group", {"e2e/tests/new.sh": "#!/bin/bash\n"}, "new.sh is a test no run starts: add new to"),
    ("a group name with no file", {"e2e/tests/job.sh": None}, "HARNESS_TESTS names job, but e2e/tests/job.sh does not"),
    ("a test in two groups",
     {"e2e/test.sh": CLEAN["e2e/test.sh"].replace("(up job)", "(up job gpu)")}, "gpu is run more"),
    ("a Rust test target the table does not name", {"a/tests/two.rs": ""}, "the tests table runs no a/tests/two.rs"),
    ("a --test in the table that does not exist",
     {"a/tests/one.rs": None}, "names --test one, which is no test target"),
    ("a feature run scripts/test.sh does not make",
     {"scripts/test.sh": CLEAN["scripts/test.sh"].split("cargo test -p kiln-a")[0]},
     "ARCHITECTURE.md:8: `cargo test -p kiln-a --features"),
    ("a target scripts/test.sh does not run",
     {"scripts/test.sh": CLEAN["scripts/test.sh"].replace("--workspace", "-p kiln-a")},
     "scripts/test.sh runs no b/tests/x.rs"),
]


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o755 if text.startswith("#!") else 0o644)


def self_test():
    failures = []
    for what, change, want in CASES:
        files = {**CLEAN, **change}
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, {k: v for k, v in files.items() if v is not None})
            problems, _ = check(root)
        if (want is None and problems) or (want is not None and (len(problems) != 1 or want not in problems[0])):
            failures.append(f"{what}: got {problems}")
    for f in failures:
        print(f"self-test: {f}")
    print(f"self-test: {'failed' if failures else 'ok'} ({len(CASES)} cases)")
    return 1 if failures else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    problems, summary = check(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if problems:
        print(f"{len(problems)} problem(s): a test no run starts, or a run with no test:")
        print("\n".join(problems))
        return 1
    print(f"every test is run and every run has its test: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
