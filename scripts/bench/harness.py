#!/usr/bin/env python3
"""Benchmarks that hold still: kiln against its bound, interleaved, with the spread and a verdict
only where the spread allows one (issue 51). Python 3.11, standard library only.

One comparison has two sides, A (kiln) and B (its bound or peer: llama-bench, ONNX Runtime,
KServe...), each a command, and one or more figures read from every run of both. The harness
runs them interleaved, A B A B ..., for --rounds rounds (5; --warmup adds a first pair that is
discarded), so that a machine that slows down or speeds up slows both sides alike. Per figure it
prints each side's median and min-max, the ratio of the medians oriented so that >1 means kiln
is better (it says which way it divided), the range of the per-round paired ratios, and with
--goal a verdict:

    kiln >= GOALx of BOUND        the lower end of the paired ratios clears the goal
    kiln below GOALx of BOUND     the upper end does not reach it
    inconclusive (spread a-b)     otherwise; and "one round: no verdict" from a single round

It prints the load average (1/5/15) before and after, the CPU governor and the core count, and
refuses to run (exit 3) when the 1-minute load before is above the free cores (the cores less
those the benchmark uses) by more than 0.25, the quiet machine's daemons, unless --force-noisy,
which marks every line NOISY.

A figure is read by a spec: `regex:PATTERN` (one group; its last match in stdout),
`json:PATH` (stdout as JSON, or its last line that is; PATH is keys and [N] indices joined by
dots, [KEY=VALUE] picks the first list element whose KEY is VALUE; `json:P/Q` is P divided by Q)
or `wall` (the seconds the harness measured around the command). Orientation per figure:
`--figure NAME:higher` (the default, or :lower when a side is `wall`) or `--figure NAME:lower`.

From a shell benchmark: a command is one string split as a shell would (shlex), or a JSON array
of strings, the safe form for paths and scripts (`python3 -c 'import json, sys;
print(json.dumps(sys.argv[1:]))' ARGV...` makes one; scripts/bench/llm.sh shows a whole one):

    python3 scripts/bench/harness.py --check-load --threads "$THREADS"   # exit 3 when too busy
    python3 scripts/bench/harness.py --name smollm2 --bound llama-bench --goal 0.95 \\
      --rounds 5 --warmup --threads "$THREADS" --pin 0,1 --load-before "$LOAD_AT_START" \\
      --a "$(argv_json "$agent" local --output json --store s kiln.yaml)" \\
      --b "$bench -m m.gguf -t {threads} -p 60 -n 32 -o json" \\
      --figure 'decode tok/s:higher' \\
      --a-get json:generation.decodeTokensPerSecond --b-get 'json:[n_prompt=0].avg_ts' \\
      --json out.json --markdown >>rows.md

--threads N replaces {threads} in both commands (and counts N cores as busy; --uses-cores
says otherwise, e.g. a server that uses every core); --pin LIST runs both under
`taskset -c LIST` when taskset exists. --markdown sends the report to stderr and prints one
README row per figure on stdout (--markdown=FILE appends them to FILE, the report staying on
stdout):

    | name | kiln median (min–max) | bound median (min–max) | ratio (range) | rounds | load before→after | verdict |

--load-before "L1 L5 L15" gives the load the caller read at its own start, before its own work
(fixtures, compiles, earlier comparisons) raised the average; --assume-load is the same option,
the spelling the self-test uses. --check-load runs only that gate and prints the machine, so a
script can refuse before its slow preparation. --json FILE writes everything: per-round values,
medians, ranges, ratios, verdicts, load, governor, cores, the commands and their call order.

    python3 scripts/bench/harness.py --self-test    # the statistics and rules on fake sides

Exit status: 0 measured; 1 a command failed (its stderr is shown) or a figure was not in its
output; 2 a usage error; 3 refused: the machine is too busy.
"""
import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 1, 2, 3
TAIL_LINES = 40
# Load the gate allows above the free cores: a quiet machine's daemons keep the 1-minute average
# at 0.05-0.2, which would refuse every benchmark that uses all the cores.
LOAD_SLACK = 0.25


class HarnessError(Exception):
    """A side's command failed or its figure was not in its output (exit 1)."""


class Refused(Exception):
    """The machine is too busy for figures that mean anything (exit 3)."""


@dataclass
class Figure:
    """One figure read from every run of both sides, and which way is better."""
    name: str
    a_get: str  # how to read it from A's run: regex:PATTERN, json:PATH[/PATH] or wall
    b_get: str
    higher_is_better: bool = True


@dataclass
class Plan:
    """One comparison: the two commands, the figures and how to run them."""
    name: str
    a_argv: list
    b_argv: list
    figures: list
    bound: str = "bound"
    a_label: str = "kiln"
    rounds: int = 5
    warmup: bool = False
    goal: float | None = None
    threads: int | None = None
    uses_cores: float | None = None  # cores the benchmark keeps busy; default threads, else 1
    pin: str | None = None
    force_noisy: bool = False
    load_before: list | None = None  # the caller's reading; None: read it now
    timeout: float | None = None
    extra: dict = field(default_factory=dict)  # anything the caller wants kept in the JSON


# ---- reading a figure from a run's output ----

def check_spec(spec):
    """Raises ValueError unless SPEC is a figure spec this harness reads."""
    kind, _, arg = spec.partition(":")
    if spec == "wall":
        return
    if kind == "regex":
        try:
            groups = re.compile(arg).groups
        except re.error as e:
            raise ValueError(f"bad regex in {spec!r}: {e}") from None
        if groups != 1:
            raise ValueError(f"{spec!r} must have exactly one group, it has {groups}")
    elif kind == "json":
        if not all(part.strip() for part in arg.split("/")) or arg.count("/") > 1:
            raise ValueError(f"{spec!r}: json:PATH or json:PATH/PATH")
    else:
        raise ValueError(f"unknown figure spec {spec!r} (regex:PATTERN, json:PATH or wall)")


def read_figure(spec, stdout, wall):
    """The figure SPEC names, from one run's stdout and wall seconds."""
    if spec == "wall":
        return wall
    kind, _, arg = spec.partition(":")
    if kind == "regex":
        found = re.findall(arg, stdout, re.MULTILINE)
        if not found:
            raise HarnessError(f"{spec!r} matched nothing in the output:\n{tail(stdout)}")
        return to_number(found[-1], spec)
    doc = json_document(stdout, spec)
    parts = [json_path(doc, p.strip(), spec) for p in arg.split("/")]
    if len(parts) == 2:
        if parts[1] == 0:
            raise HarnessError(f"{spec!r}: the divisor is 0")
        return parts[0] / parts[1]
    return parts[0]


def to_number(value, spec):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise HarnessError(f"{spec!r} gave {value!r}, not a number") from None


def json_document(stdout, spec):
    """stdout as JSON, or else its last line that parses as JSON."""
    try:
        return json.loads(stdout)
    except ValueError:
        pass
    for line in reversed(stdout.splitlines()):
        if line.strip()[:1] in ("{", "["):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise HarnessError(f"{spec!r}: no JSON in the output:\n{tail(stdout)}")


def json_path(doc, path, spec):
    """The number at PATH in DOC: keys, [N] and [KEY=VALUE] steps joined by dots."""
    node = doc
    for step in re.findall(r"\[[^\]]*\]|[^.\[\]]+", path):
        try:
            node = json_step(node, step)
        except (KeyError, IndexError, TypeError, StopIteration):
            raise HarnessError(f"{spec!r}: no {step} at that point of:\n{tail(json.dumps(doc))}") from None
    return to_number(node, spec)


def json_step(node, step):
    if not step.startswith("["):
        return node[step]
    inner = step[1:-1]
    if re.fullmatch(r"-?\d+", inner):
        return node[int(inner)]
    key, _, want = inner.partition("=")
    return next(e for e in node if isinstance(e, dict) and same(e.get(key), want))


def same(value, want):
    """Whether a JSON value equals the text of a [KEY=VALUE] step (numbers as numbers)."""
    try:
        return float(value) == float(want)
    except (TypeError, ValueError):
        return str(value) == want


def tail(text, lines=TAIL_LINES):
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join("  | " + line for line in kept) if kept else "  | (empty)"


# ---- the machine ----

def read_load():
    """The load average, 1/5/15 minutes."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return list(os.getloadavg())


def governor():
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as f:
            return f.read().strip() or "unreadable"
    except OSError:
        return "unreadable"


def cgroup_quota():
    """(cores the cgroup allows or None, what its file says)."""
    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            with open(quota_file) as f:
                text = f.read().strip()
            if period_file:
                with open(period_file) as f:
                    text += " " + f.read().strip()
        except OSError:
            continue
        quota, period = (text.split() + ["100000"])[:2]
        if quota in ("max", "-1"):
            return None, text
        return int(quota) / int(period), text
    return None, "unreadable"


def core_counts():
    """os.cpu_count, the CPUs this process may run on, the cgroup quota, and the least of them."""
    count = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else count
    quota, quota_text = cgroup_quota()
    effective = min(x for x in (count, affinity, quota) if x is not None)
    return {"os_cpu_count": count, "affinity": affinity, "cgroup_cpu_max": quota_text,
            "cgroup_cores": quota, "effective": effective}


def machine_state(plan):
    load = plan.load_before if plan.load_before else read_load()
    return {"cores": core_counts(), "governor": governor(), "load_before": load,
            "load_before_source": "given by the caller" if plan.load_before else "read before the rounds",
            "taskset": shutil.which("taskset")}


def load_gate(plan, machine):
    """Refuses (Refused) when the 1-minute load before is above the free cores; else records it."""
    busy = plan.uses_cores if plan.uses_cores is not None else (plan.threads or 1)
    cores = machine["cores"]["effective"]
    free = cores - busy
    load1 = machine["load_before"][0]
    machine.update(busy_cores=busy, free_cores=free, load_slack=LOAD_SLACK, noisy=load1 > free + LOAD_SLACK)
    if machine["noisy"] and not plan.force_noisy:
        raise Refused(
            f"the 1-minute load before ({load1:.2f}) is above the free cores ({num(free)} = {num(cores)} cores "
            f"- {num(busy)} the benchmark uses; {LOAD_SLACK} allowed above them).\nIts figures would measure the other work, not kiln. Wait for a "
            "quiet machine (flock -x /tmp/kiln-quiet.lock where it is shared), use fewer threads, or pass "
            "--force-noisy to run anyway with every line marked NOISY.")


# ---- running the sides ----

def side_argv(argv, plan, machine):
    """ARGV with {threads} filled in and, when asked and possible, under taskset."""
    if plan.threads is not None:
        argv = [s.replace("{threads}", str(plan.threads)) for s in argv]
    elif any("{threads}" in s for s in argv):
        raise ValueError("a command has {threads} but no --threads was given")
    if plan.pin and machine["taskset"]:
        argv = ["taskset", "-c", plan.pin] + argv
    return argv


def run_once(argv, timeout):
    """One run: (stdout, wall seconds); HarnessError with its stderr when it fails."""
    start = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise HarnessError(f"{argv[0]}: no such command") from None
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"timed out after {timeout} s: {shlex.join(argv)}\n{tail(e.stderr or '')}") from None
    wall = time.monotonic() - start
    if p.returncode != 0:
        raise HarnessError(f"command failed (exit {p.returncode}): {shlex.join(argv)}\n"
                           f"its stderr, last {TAIL_LINES} lines:\n{tail(p.stderr)}")
    return p.stdout, wall


def run_rounds(plan, argvs, say):
    """Every round, A then B; the figures per side (warmup read, so a bad spec fails early, then dropped)."""
    values = {f.name: {"a": [], "b": []} for f in plan.figures}
    order, walls = [], {"a": [], "b": []}
    labels = {"a": plan.a_label, "b": plan.bound}
    for i in range(plan.rounds + (1 if plan.warmup else 0)):
        warm = plan.warmup and i == 0
        got = {}
        for side in ("a", "b"):
            order.append(side.upper() + (" (warmup)" if warm else ""))
            stdout, wall = run_once(argvs[side], plan.timeout)
            got[side] = [read_figure(getattr(f, side + "_get"), stdout, wall) for f in plan.figures]
            if not warm:
                walls[side].append(wall)
        if warm:
            say(f"warmup round (discarded): {per_round_text(plan, labels, got)}")
            continue
        for k, f in enumerate(plan.figures):
            for side in ("a", "b"):
                values[f.name][side].append(got[side][k])
        say(f"round {i + (0 if plan.warmup else 1)}/{plan.rounds}: {per_round_text(plan, labels, got)}")
    return values, order, walls


def per_round_text(plan, labels, got):
    return "; ".join(f"{f.name} {labels['a']} {num(got['a'][k])}, {labels['b']} {num(got['b'][k])}"
                     for k, f in enumerate(plan.figures))


# ---- the statistics and the verdict ----

def oriented(a, b, higher_is_better):
    """A's figure over B's, turned so that >1 means A (kiln) is better."""
    num_, den = (a, b) if higher_is_better else (b, a)
    if den == 0:
        raise HarnessError("a figure is 0: no ratio")
    return num_ / den


def spread(values):
    return {"values": values, "median": statistics.median(values), "min": min(values), "max": max(values)}


def verdict(paired, goal, a_label, bound):
    """(kind, text): met, below, inconclusive or no-verdict; (None, None) without a goal."""
    if goal is None:
        return None, None
    if len(paired) < 2:
        return "no-verdict", "one round: no verdict"
    lo, hi = min(paired), max(paired)
    if lo >= goal:
        return "met", f"{a_label} ≥ {goal:g}x of {bound}"
    if hi < goal:
        return "below", f"{a_label} below {goal:g}x of {bound}"
    return "inconclusive", f"inconclusive (spread {ratio_range(lo, hi)})"


def summarize(plan, figure, values):
    """One figure's spreads, ratios and verdict."""
    a, b, higher = values["a"], values["b"], figure.higher_is_better
    paired = [oriented(x, y, higher) for x, y in zip(a, b)]
    kind, text = verdict(paired, plan.goal, plan.a_label, plan.bound)
    division = f"{plan.a_label}/{plan.bound}" if higher else f"{plan.bound}/{plan.a_label}"
    better = "higher" if higher else "lower"
    return {"name": figure.name, "better": better, "a_get": figure.a_get, "b_get": figure.b_get,
            "a": spread(a), "b": spread(b),
            "ratio_of_medians": oriented(statistics.median(a), statistics.median(b), higher),
            "ratio_is": f"{division} ({better} is better): >1 means {plan.a_label} is better",
            "paired_ratios": paired, "paired_min": min(paired), "paired_max": max(paired),
            "verdict_kind": kind, "verdict": text}


def measure(plan, say=None):
    """Runs PLAN and returns everything measured (what --json writes); raises Refused, HarnessError."""
    check_plan(plan)
    machine = machine_state(plan)
    load_gate(plan, machine)
    argvs = {"a": side_argv(plan.a_argv, plan, machine), "b": side_argv(plan.b_argv, plan, machine)}
    mark = "NOISY: " if machine["noisy"] else ""
    values, order, walls = run_rounds(plan, argvs, lambda line: say and say(mark + line))
    machine["load_after"] = read_load()
    return {"name": plan.name, "a_label": plan.a_label, "bound": plan.bound, "rounds": plan.rounds,
            "warmup": plan.warmup, "goal": plan.goal, "threads": plan.threads, "pin": plan.pin,
            "pinned": bool(plan.pin and machine["taskset"]), "machine": machine,
            "commands": {s: shlex.join(argvs[s]) for s in argvs}, "argv": argvs, "order": order,
            "wall_seconds": walls, "extra": plan.extra,
            "figures": [summarize(plan, f, values[f.name]) for f in plan.figures]}


def check_plan(plan):
    if plan.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if not plan.a_argv or not plan.b_argv:
        raise ValueError("both sides need a command (--a and --b)")
    if not plan.figures:
        raise ValueError("no figure to read")
    for f in plan.figures:
        check_spec(f.a_get)
        check_spec(f.b_get)


# ---- the report ----

def num(x):
    """A figure, short: four significant digits, no exponent for large ones."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def ratio_range(lo, hi):
    """A ratio range rounded outwards to two decimals, so the printed range holds the true one."""
    return f"{math.floor(round(lo * 100, 6)) / 100:.2f}–{math.ceil(round(hi * 100, 6)) / 100:.2f}"


def loads(values):
    return " ".join(f"{v:.2f}" for v in values)


def report_lines(r):
    """The human report, every line marked NOISY when the machine was busy."""
    lines = [f"== {r['name']}: {r['a_label']} vs {r['bound']}, {r['rounds']} rounds interleaved A B A B"
             + (" after 1 warmup round (discarded)" if r["warmup"] else "")]
    lines += machine_lines(r["machine"], r["threads"], r["pin"], r["pinned"])
    for f in r["figures"]:
        lines += figure_lines(r, f)
    return [("NOISY: " if r["machine"]["noisy"] else "") + line for line in lines]


def machine_lines(m, threads, pin, pinned):
    """Cores, governor, threads, pinning and the load (before, and after when measured)."""
    c = m["cores"]
    pin_text = ("pinned: taskset -c " + pin) if pinned else ("not pinned (taskset not found)" if pin else "not pinned")
    after = f", after {loads(m['load_after'])}" if "load_after" in m else ""
    lines = [f"machine: {num(c['effective'])} cores (os.cpu_count {c['os_cpu_count']}, affinity {c['affinity']}, "
             f"cgroup cpu.max {c['cgroup_cpu_max']}); governor {m['governor']}; threads "
             f"{threads if threads is not None else '-'}, {num(m['busy_cores'])} cores busy; {pin_text}",
             f"load 1/5/15 before {loads(m['load_before'])} ({m['load_before_source']}){after}"]
    if m["noisy"]:
        lines.append(f"the 1-minute load before is above the {num(m['free_cores'])} free cores (+{LOAD_SLACK}): "
                     "measured on a busy machine (--force-noisy)")
    return lines


def figure_lines(r, f):
    width = max(len(r["a_label"]), len(r["bound"]))
    lines = [f"{f['name']} ({f['better']} is better)"]
    for label, s in ((r["a_label"], f["a"]), (r["bound"], f["b"])):
        lines.append(f"  {label:<{width}}  median {num(s['median'])} (min–max {num(s['min'])}–{num(s['max'])}); "
                     f"rounds {' '.join(num(v) for v in s['values'])}")
    paired = ratio_range(f["paired_min"], f["paired_max"])
    lines.append(f"  ratio {f['ratio_of_medians']:.2f}x of the medians, paired {paired} "
                 f"[{f['ratio_is']}]")
    if f["verdict"]:
        lines.append(f"  verdict: {f['verdict']}")
    return lines


def markdown_rows(r):
    """One README row per figure (the header is in the module's docstring)."""
    m = r["machine"]
    rows = []
    for f in r["figures"]:
        name = ("NOISY: " if m["noisy"] else "") + f"{r['name']} {f['name']}"
        side = [f"{num(s['median'])} ({num(s['min'])}–{num(s['max'])})" for s in (f["a"], f["b"])]
        ratio = f"{f['ratio_of_medians']:.2f}x ({ratio_range(f['paired_min'], f['paired_max'])})"
        load = f"{m['load_before'][0]:.2f}→{m['load_after'][0]:.2f}"
        rows.append(f"| {name} | {side[0]} | {side[1]} | {ratio} | {r['rounds']} | {load} | {f['verdict'] or '–'} |")
    return rows


# ---- the command line ----

def parse_args(argv):
    p = argparse.ArgumentParser(prog="harness.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--self-test", action="store_true", help="prove the statistics and rules on fake sides")
    p.add_argument("--name", default="benchmark", help="what is compared (the row's name)")
    p.add_argument("--bound", default="bound", help="side B's label (llama-bench, onnxruntime, kserve...)")
    p.add_argument("--a-label", default="kiln", help="side A's label (kiln)")
    p.add_argument("--a", help="side A's command: one shell-quoted string, or a JSON array")
    p.add_argument("--b", help="side B's command, the same way")
    p.add_argument("--figure", action="append", default=[], help="NAME[:higher|:lower], once per figure")
    p.add_argument("--a-get", action="append", default=[], help="how to read the figure from A (per --figure)")
    p.add_argument("--b-get", action="append", default=[], help="how to read the figure from B (per --figure)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", action="store_true", help="run one more pair first and discard it")
    p.add_argument("--goal", type=float, help="the ratio a verdict is judged against (e.g. 0.95)")
    p.add_argument("--threads", type=int, help="fills {threads} in both commands; counts as busy cores")
    p.add_argument("--uses-cores", type=float, help="cores the benchmark keeps busy (default: --threads, else 1)")
    p.add_argument("--pin", help="CPU list for taskset -c on both sides (when taskset exists)")
    p.add_argument("--force-noisy", action="store_true", help="run on a busy machine, every line marked NOISY")
    p.add_argument("--load-before", "--assume-load", dest="load_before",
                   help="the 1-minute load before (or '1m 5m 15m'), instead of reading it now")
    p.add_argument("--timeout", type=float, help="seconds one command may take")
    p.add_argument("--json", help="write everything measured to this file")
    p.add_argument("--markdown", nargs="?", const="-", metavar="FILE",
                   help="README rows: alone, on stdout (the report then on stderr); =FILE, appended to FILE")
    p.add_argument("--check-load", action="store_true",
                   help="only the machine and the load gate (with --threads/--uses-cores): exit 0, or 3 when busy")
    return p.parse_args(argv)


def command(text, which):
    if not text:
        raise ValueError(f"--{which} is missing: side {which.upper()}'s command")
    if text.lstrip().startswith("["):
        argv = json.loads(text)
        if not isinstance(argv, list) or not all(isinstance(s, str) for s in argv):
            raise ValueError(f"--{which}: a JSON command is an array of strings")
        return argv
    return shlex.split(text)


def figures_from_args(args):
    names = args.figure or ["figure"]
    if not len(names) == len(args.a_get) == len(args.b_get):
        raise ValueError(f"{len(names)} --figure, {len(args.a_get)} --a-get and {len(args.b_get)} --b-get: "
                         "give one --a-get and one --b-get per figure")
    figures = []
    for name, a, b in zip(names, args.a_get, args.b_get):
        label, sep, better = name.rpartition(":")
        if not sep or better not in ("higher", "lower"):
            label, better = name, "lower" if "wall" in (a, b) else "higher"
        figures.append(Figure(label, a, b, better == "higher"))
    return figures


def parse_load(text):
    """--load-before's text as a list of one to three numbers, or None."""
    if text is None:
        return None
    try:
        load = [float(x) for x in text.split()]
    except ValueError:
        load = []
    if not 1 <= len(load) <= 3:
        raise ValueError(f"--load-before {text!r}: one to three numbers")
    return load


def plan_from_args(args):
    return Plan(name=args.name, a_argv=command(args.a, "a"), b_argv=command(args.b, "b"),
                figures=figures_from_args(args), bound=args.bound, a_label=args.a_label,
                rounds=args.rounds, warmup=args.warmup, goal=args.goal, threads=args.threads,
                uses_cores=args.uses_cores, pin=args.pin, force_noisy=args.force_noisy,
                load_before=parse_load(args.load_before), timeout=args.timeout)


def shout(text):
    """The refusal, loudly, on stderr."""
    bar = "harness: " + "*" * 72
    print(bar, file=sys.stderr)
    for line in ("REFUSED: " + text).splitlines():
        print("harness: " + line, file=sys.stderr)
    print(bar, file=sys.stderr)


def gate_lines(args):
    """--check-load: the machine and the load gate alone (Refused when it is too busy)."""
    plan = Plan(name=args.name, a_argv=[], b_argv=[], figures=[], threads=args.threads,
                uses_cores=args.uses_cores, force_noisy=args.force_noisy, load_before=parse_load(args.load_before))
    machine = machine_state(plan)
    load_gate(plan, machine)
    pinned = bool(args.pin and machine["taskset"])
    return [("NOISY: " if machine["noisy"] else "") + line
            for line in machine_lines(machine, args.threads, args.pin, pinned)]


def emit(result, args):
    """The report, the README rows (--markdown: stdout, the report then on stderr; or a file) and --json."""
    to_stdout = args.markdown == "-"
    for line in report_lines(result):
        print(line, file=sys.stderr if to_stdout else sys.stdout)
    if to_stdout:
        print("\n".join(markdown_rows(result)))
    elif args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n".join(markdown_rows(result)) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.self_test:
        return self_test()
    try:
        if args.check_load:
            print("\n".join(gate_lines(args)))
            return 0
        result = measure(plan_from_args(args), say=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"harness: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as e:
        shout(str(e))
        return EXIT_REFUSED
    except HarnessError as e:
        print(f"harness: {args.name}: {e}", file=sys.stderr)
        return EXIT_FAILED
    emit(result, args)
    return 0


# ---- the self-test: fake sides that print chosen numbers, one per round ----

# argv: COUNTER ORDER LABEL VALUES. Appends LABEL to ORDER (the call order), prints the value for
# this call (VALUES comma-separated, taken in turn by the counter) as text and as JSON, or fails.
FAKE = """
import json, os, sys
counter, order, label, values = sys.argv[1:5]
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
open(order, "a").write(label + " ")
if values == "fail":
    sys.exit("boom: the fake side failed on purpose")
v = float(values.split(",")[n % len(values.split(","))])
print("warming up 1.0")
print("rate", v)
print(json.dumps({"g": {"tokens": v * 2, "seconds": 2.0}, "rows": [{"n_gen": 5, "ts": -1}, {"n_gen": 0, "ts": v}]}))
"""


def fake(tmp, label, values):
    """A fake side's argv, with its own counter file."""
    return [sys.executable, "-c", FAKE, os.path.join(tmp, label + ".count"), os.path.join(tmp, "order"), label, values]


def fake_plan(tmp, a, b, higher=True, **kw):
    kw.setdefault("load_before", [0.0])
    kw.setdefault("goal", 0.95)
    fig = Figure("rate", r"regex:^rate (\S+)$", r"regex:^rate (\S+)$", higher)
    return Plan(name="fake", a_argv=fake(tmp, "A", a), b_argv=fake(tmp, "B", b), figures=[fig],
                bound="fakebench", **kw)


def case_interleaved(tmp):
    cpu = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "0"
    plan = fake_plan(tmp, "1", "1", rounds=2, warmup=True, threads=1, pin=cpu)
    plan.a_argv[5], plan.b_argv[5] = "A{threads}", "B{threads}"  # filled in on both sides
    r = measure(plan)
    with open(os.path.join(tmp, "order")) as f:
        order = f.read().split()
    assert order == ["A1", "B1"] * 3, f"call order {order}"
    assert r["order"] == ["A (warmup)", "B (warmup)", "A", "B", "A", "B"], r["order"]
    assert len(r["figures"][0]["a"]["values"]) == 2, "the warmup round was kept"
    return f"A B A B A B (warmup dropped), threads filled in both, pinned: {r['pinned']}"


def case_win(tmp):
    r = measure(fake_plan(tmp, "100,102,98,101,99", "90,91,89,92,90"))
    f = r["figures"][0]
    assert f["verdict_kind"] == "met", f["verdict"]
    assert f["verdict"] == "kiln ≥ 0.95x of fakebench", f["verdict"]
    assert abs(f["ratio_of_medians"] - 100 / 90) < 1e-9 and f["a"]["median"] == 100, f
    assert abs(f["paired_min"] - 101 / 92) < 1e-9 and abs(f["paired_max"] - 102 / 91) < 1e-9, f
    return f"clear win: {f['verdict']} (paired {ratio_range(f['paired_min'], f['paired_max'])})"


def case_loss(tmp):
    r = measure(fake_plan(tmp, "80,82,79", "100,99,101"))
    f = r["figures"][0]
    assert f["verdict_kind"] == "below" and f["verdict"] == "kiln below 0.95x of fakebench", f["verdict"]
    return f"clear loss: {f['verdict']}"


def case_inconclusive(tmp):
    r = measure(fake_plan(tmp, "90,100,96", "100,100,100"))
    f = r["figures"][0]
    assert f["verdict"] == "inconclusive (spread 0.90–1.00)", f["verdict"]
    assert abs(f["ratio_of_medians"] - 0.96) < 1e-9, f["ratio_of_medians"]
    return f"overlap: {f['verdict']}"


def case_one_round(tmp):
    r = measure(fake_plan(tmp, "200", "100", rounds=1))
    f = r["figures"][0]
    assert f["verdict_kind"] == "no-verdict" and f["verdict"] == "one round: no verdict", f["verdict"]
    return "one round, a 2x win: one round: no verdict"


def case_orientation(tmp):
    plan = fake_plan(tmp, "1.0,1.0", "1.2,1.2", rounds=2)
    plan.figures = [Figure("seconds", r"regex:^rate (\S+)$", "json:rows[n_gen=0].ts", higher_is_better=False),
                    Figure("rate", "json:g.tokens/g.seconds", r"regex:^rate (\S+)$", higher_is_better=True),
                    Figure("wall", "wall", "wall", higher_is_better=False)]
    r = measure(plan)
    low, high, wall = r["figures"]
    assert abs(low["ratio_of_medians"] - 1.2) < 1e-9 and low["verdict_kind"] == "met", low
    assert abs(high["ratio_of_medians"] - 1 / 1.2) < 1e-9 and high["verdict_kind"] == "below", high
    assert low["ratio_is"].startswith("fakebench/kiln") and high["ratio_is"].startswith("kiln/fakebench")
    assert all(v > 0 for v in wall["a"]["values"] + wall["b"]["values"]), wall
    return "1.0 vs 1.2: lower-better 1.20x met, higher-better 0.83x below (regex, json path, quotient, wall)"


def cli(args):
    """Runs this file's CLI in a child: (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def fake_cli(tmp, a, b, *more):
    return ["--name", "fake", "--bound", "fakebench", "--a", json.dumps(fake(tmp, "A", a)),
            "--b", json.dumps(fake(tmp, "B", b)), "--figure", "rate:higher", "--a-get", r"regex:^rate (\S+)$",
            "--b-get", r"regex:^rate (\S+)$", "--goal", "0.95", "--threads", "1"] + list(more)


def case_refusal(tmp):
    rc, out, err = cli(fake_cli(tmp, "1", "1", "--rounds", "2", "--assume-load", "999"))
    assert rc == EXIT_REFUSED and "REFUSED" in err and "free cores" in err, (rc, err)
    assert not os.path.exists(os.path.join(tmp, "order")), "a side ran although the harness refused"
    rc, out, err = cli(["--check-load", "--threads", "1", "--assume-load", "999"])
    assert rc == EXIT_REFUSED and "REFUSED" in err, ("--check-load", rc, err)
    rc, out, err = cli(["--check-load", "--threads", "1", "--assume-load", "0"])
    assert rc == 0 and out.startswith("machine: ") and "NOISY" not in out, ("--check-load", rc, out, err)
    every = str(core_counts()["effective"])
    rc, out, err = cli(["--check-load", "--uses-cores", every, "--assume-load", "0.2"])
    assert rc == 0 and "NOISY" not in out, ("all cores busy, load 0.2: within the slack", rc, out, err)
    rc, out, err = cli(["--check-load", "--uses-cores", every, "--assume-load", "0.3"])
    assert rc == EXIT_REFUSED, ("all cores busy, load 0.3: above the slack", rc, out, err)
    rc, out, err = cli(fake_cli(tmp, "1", "1", "--rounds", "2", "--assume-load", "999", "--force-noisy"))
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert rc == 0 and lines and all("NOISY" in line for line in lines), (rc, out, err)
    return (f"load 999: exit 3 with REFUSED on stderr (and --check-load); every core busy: load 0.2 runs, 0.3 "
            f"refused; --force-noisy: ran, {len(lines)} lines all NOISY")


def case_failure(tmp):
    rc, out, err = cli(fake_cli(tmp, "1", "fail", "--assume-load", "0"))
    assert rc == EXIT_FAILED and "boom: the fake side failed on purpose" in err and "exit 1" in err, (rc, err)
    return "a failing side: exit 1, its stderr shown"


def case_outputs(tmp):
    path = os.path.join(tmp, "out.json")
    rc, out, err = cli(fake_cli(tmp, "100,102", "90,91", "--rounds", "2", "--assume-load", "0",
                                "--json", path, "--markdown"))
    assert rc == 0, err
    rows = out.strip().splitlines()
    assert len(rows) == 1 and rows[0].count("|") == 8, rows
    assert "| 2 |" in rows[0] and "kiln ≥ 0.95x of fakebench" in rows[0] and "verdict:" in err, (rows, err)
    with open(path) as f:
        r = json.load(f)
    assert r["figures"][0]["a"]["values"] == [100.0, 102.0] and r["order"] == ["A", "B", "A", "B"], r
    assert {"governor", "cores", "load_before", "load_after"} <= set(r["machine"]) and r["commands"]["a"], r
    return "--markdown: one 7-column row on stdout, report on stderr; --json: values, order, machine, commands"


CASES = [case_interleaved, case_win, case_loss, case_inconclusive, case_one_round, case_orientation,
         case_refusal, case_failure, case_outputs]


def self_test():
    """Every case on fake sides: one 'ok' line each; exit 1 on any failure."""
    failed = 0
    for case in CASES:
        name = case.__name__[len("case_"):]
        with tempfile.TemporaryDirectory(prefix="kiln-harness-") as tmp:
            try:
                print(f"ok {name}: {case(tmp)}")
            except (AssertionError, HarnessError, Refused, ValueError) as e:
                failed += 1
                print(f"FAIL {name}: {e}")
    print(f"self-test: {len(CASES) - failed} of {len(CASES)} cases ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
