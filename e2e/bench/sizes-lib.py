#!/usr/bin/env python3
"""Helpers of e2e/bench/sizes.sh (standard library only).

    sizes-lib.py sample FILE [INTERVAL]   # until killed: one JSON line per INTERVAL (0.25 s)
    sizes-lib.py report DIR               # DIR: what sizes.sh collected for one variant

`sample` reads /proc every INTERVAL seconds and appends one JSON line to FILE: the time, the
node's used memory (MemTotal - MemAvailable) and page cache (Cached), the bytes read from the
block devices (/proc/diskstats, whole disks), the bytes through the cluster's pod bridge cni0
(rx + tx, from /proc/<registry>/net/dev: the registry runs in the cluster's network namespace),
and for each process of interest its role, VmRSS, VmHWM and read_bytes (/proc/PID/io). Roles
from the command line: `agent` (kiln-agent run), `engine` (a kiln-agent engine child, of the
agent or of a compile), `compile` (kiln-agent compile), `csi` (kiln-csi), `llama-server`,
`registry` (docker-registry).

`report` reads DIR/times.json (the bench's own clock readings and bounds), the logs and API
objects the bench saved there, and the samples, finds each stage's start and end from those
signals, and prints the markdown table, the headline and the RESULT line.
"""
import datetime
import glob
import json
import os
import re
import sys
import time

ROLES = ("agent", "engine", "compile", "csi", "llama-server", "registry")


def role_of(argv, exe=None):
    if not argv:
        return None
    # the engine child is started as /proc/self/exe: its argv[0] says nothing, its exe link does
    exe = os.path.basename(exe or argv[0]).replace(" (deleted)", "")
    rest = argv[1:]
    if exe == "kiln-agent":
        if "engine" in rest:
            return "engine"
        for r in ("run", "compile"):
            if r in rest:
                return "agent" if r == "run" else r
        return None
    if exe == "kiln-csi":
        return "csi"
    if exe == "llama-server":
        return "llama-server"
    if exe == "docker-registry":
        return "registry"
    return None


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def meminfo():
    m = {}
    for line in (read("/proc/meminfo") or "").splitlines():
        k, v = line.split(":", 1)
        m[k] = int(v.split()[0]) * 1024
    return m


def disk_read_bytes():
    total = 0
    for line in (read("/proc/diskstats") or "").splitlines():
        f = line.split()
        name = f[2]
        # whole disks only (vda, sda, nvme0n1), not partitions or loop/ram devices
        if re.fullmatch(r"(vd|sd|xvd|hd)[a-z]+|nvme\d+n\d+", name):
            total += int(f[5]) * 512
    return total


def bridge_bytes(pid):
    if not pid:
        return None
    for line in (read(f"/proc/{pid}/net/dev") or "").splitlines():
        if line.strip().startswith("cni0:"):
            f = line.split(":", 1)[1].split()
            return int(f[0]) + int(f[8])
    return None


def role_of_pid(d):
    """The role (role_of) of the process whose /proc directory is `d`, or None."""
    cmd = read(d + "/cmdline")
    if not cmd:
        return None
    try:
        exe = os.readlink(d + "/exe")
    except OSError:
        exe = None
    return role_of(cmd.split("\0"), exe)


def sample(out, interval):
    reg = None
    with open(out, "a", buffering=1) as f:
        while True:
            t = time.time()
            procs = {}
            for d in glob.glob("/proc/[0-9]*"):
                role = role_of_pid(d)
                if not role:
                    continue
                st = read(d + "/status") or ""
                io = read(d + "/io") or ""
                g = lambda k, s: int(m.group(1)) if (m := re.search(k + r":\s+(\d+)", s)) else 0
                pid = d.rsplit("/", 1)[1]
                procs[pid] = [role, g("VmRSS", st) * 1024, g("VmHWM", st) * 1024, g("read_bytes", io)]
                if role == "registry":
                    reg = pid
            m = meminfo()
            f.write(json.dumps({"t": round(t, 3), "used": m["MemTotal"] - m["MemAvailable"],
                                "cached": m.get("Cached", 0), "disk": disk_read_bytes(),
                                "net": bridge_bytes(reg), "p": procs}) + "\n")
            time.sleep(max(0.0, interval - (time.time() - t)))


# ---------------------------------------------------------------------------------------------

def ts(s):
    """RFC 3339 (the API's seconds or the logs' microseconds) to epoch seconds."""
    if s is None:
        return None
    if isinstance(s, (int, float)):
        return float(s)
    s = s.strip().replace("Z", "+00:00")
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)", s)
    frac = float(m.group(2)) if m.group(2) else 0.0
    return datetime.datetime.fromisoformat(m.group(1) + (m.group(3) or "+00:00")).timestamp() + frac


def log_lines(path):
    """(epoch, message, fields) of a JSON log (tracing's JSON format; other lines skipped)."""
    out = []
    for line in (read(path) or "").splitlines():
        # `kubectl logs --timestamps` prefix, if any
        if line[:1].isdigit() and " {" in line:
            line = line.split(" ", 1)[1]
        try:
            j = json.loads(line)
        except ValueError:
            # tracing's text format: TIME LEVEL TARGET: MESSAGE key=value ...
            m = re.match(r"(\d{4}-\d\d-\d\dT\S+Z)\s+\w+\s+\S+: (.*)$", line)
            if m:
                fields = {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', m.group(2))}
                out.append((ts(m.group(1)), m.group(2), fields))
            continue
        fields = j.get("fields", {})
        out.append((ts(j.get("timestamp")), fields.get("message", ""), fields))
    return out


def watched(path):
    """(epoch, text) of a watch log written by `watch`."""
    out = []
    for line in (read(path) or "").splitlines():
        t, _, rest = line.partition(" ")
        out.append((float(t), rest))
    return out


def watch(out, cmd):
    """Runs CMD (a kubectl watch printing one line per event), each line prefixed with the time
    it was read, until SIGTERM."""
    import signal
    import subprocess
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    signal.signal(signal.SIGTERM, lambda *_: (p.terminate(), sys.exit(0)))
    with open(out, "a", buffering=1) as f:
        for line in p.stdout:
            f.write(f"{time.time():.6f} {line}")


def first(lines, pred):
    for t, msg, f in lines:
        if pred(msg, f):
            return t, f
    return None, None


def mib(b):
    return "—" if b is None else f"{b / 1048576:.0f}M"


def gb(b):
    return "—" if b is None else (f"{b / 1e9:.2f}G" if b >= 1e8 else f"{b / 1e6:.1f}M")


def window(samples, t0, t1):
    """Samples covering [t0, t1]: the last one at or before t0 through the first at or after t1."""
    i0 = max([i for i, s in enumerate(samples) if s["t"] <= t0] or [0])
    after = [i for i, s in enumerate(samples) if s["t"] >= t1]
    i1 = after[0] if after else len(samples) - 1
    return samples[i0:i1 + 1]


def resources(samples, t0, t1):
    w = window(samples, min(t0, t1), max(t0, t1))
    if len(w) < 1:
        w = samples[-1:]
    r = {"used": max(s["used"] for s in w), "used0": w[0]["used"],
         "cached": max(s["cached"] for s in w),
         "disk": w[-1]["disk"] - w[0]["disk"],
         "net": (w[-1]["net"] - w[0]["net"]) if w[-1]["net"] is not None and w[0]["net"] is not None else None}
    before = w[0]["p"]
    # per role: peak RSS (sampled VmRSS; of the processes started in the window when there are
    # any, else of all), read_bytes delta summed over its processes
    rss, rd = {}, {}
    started = {pid for s in w[1:] for pid in s["p"] if pid not in before}
    for role in ROLES:
        pids = {pid for s in w for pid, p in s["p"].items() if p[0] == role}
        if not pids:
            continue
        new = pids & started
        use = new or pids
        rss[role] = max(p[1] for s in w for pid, p in s["p"].items() if pid in use)
        total = 0
        for pid in pids:
            vals = [s["p"][pid][3] for s in w if pid in s["p"]]
            base = before[pid][3] if pid in before else 0
            total += vals[-1] - base
        rd[role] = total
    r["rss"], r["read"] = rss, rd
    return r


def main_report(d):
    T = json.load(open(os.path.join(d, "times.json")))
    samples = [json.loads(l) for l in open(os.path.join(d, "samples.jsonl")) if l.strip()]
    agent = log_lines(os.path.join(d, "agent.log"))
    comp = log_lines(os.path.join(d, "compile.log"))
    csi = log_lines(os.path.join(d, "csi.log"))
    job = json.load(open(os.path.join(d, "job.json")))
    pods = sorted(json.load(open(os.path.join(d, "pods.json")))["items"],
                  key=lambda p: p["metadata"]["creationTimestamp"])
    row = json.load(open(os.path.join(d, "row.json")))
    key = T["target_key"]  # ns/name
    B = T["bounds"]

    def cond(p, typ):
        for c in p["status"].get("conditions", []):
            if c["type"] == typ:
                return ts(c["lastTransitionTime"])
        return None

    t_apply = T["apply"]
    t_job = ts(job["metadata"]["creationTimestamp"])
    t_fetched, _ = first(comp, lambda m, f: m.startswith("fetching") and "model source" in m and "percent=100" in m)
    t_compiling, _ = first(comp, lambda m, f: "compiling compile_key" in m)
    t_quant, _ = first(comp, lambda m, f: "llama_model_quantize_impl: quant size" in m)
    t_stored, _ = first(comp, lambda m, f: m.startswith("stored artifact"))
    t_cdone, _ = first(comp, lambda m, f: m.startswith("compile done"))
    t_cdone = t_cdone or ts(job["status"].get("completionTime"))
    t_prep, _ = first(agent, lambda m, f: m == "preparing" and f.get("target") == key)
    t_pulled, pf = first(agent, lambda m, f: m.startswith("artifact pulled and verified"))
    t_loaded, _ = first(agent, lambda m, f: "kiln-agent engine: loaded" in m)
    t_ready, rf = first(agent, lambda m, f: m == "ready" and f.get("target") == key)
    pubs = [(t, f) for t, m, f in csi if m == "published read-only" and f.get("target") == key]
    refused = sum(1 for t, m, f in csi if m == "not published" and f.get("target") == key)
    # What the watches saw (observation times, ms-precise; the API's own times are whole seconds).
    pw = watched(os.path.join(d, "pods.watch"))  # NAME NODE READY
    names = []
    for _, text in pw:
        n = text.split(" ")[0]
        if n and n not in names:
            names.append(n)
    def seen(name, pred):
        return next((t for t, text in pw if text.split(" ")[0] == name and pred(text.split(" "))), None)
    sched = lambda f: len(f) > 1 and f[1] != ""
    ready = lambda f: len(f) > 2 and f[2] == "True"
    n1 = names[0] if names else None
    n2 = names[1] if len(names) > 1 else None
    t_sched1, t_ready1 = seen(n1, sched), seen(n1, ready)
    t_sched2, t_ready2 = seen(n2, sched), seen(n2, ready)
    # without a watch line, the API's own (whole-second) times
    if pods:
        t_sched1, t_ready1 = t_sched1 or cond(pods[0], "PodScheduled"), t_ready1 or cond(pods[0], "Ready")
    if len(pods) > 1:
        t_sched2, t_ready2 = t_sched2 or cond(pods[1], "PodScheduled"), t_ready2 or cond(pods[1], "Ready")
    nw = watched(os.path.join(d, "node.watch"))
    label = f'{key.split("/")[0]}.ready.kiln.dev/{key.split("/")[1]}'
    t_label = next((t for t, text in nw if label in text), None)
    rw = watched(os.path.join(d, "kilnnode.watch"))
    phases = {}
    for t, text in rw:
        for item in text.split():
            k, _, ph = item.partition("=")
            if k == key and ph and ph not in phases:
                phases[ph] = t
    t_pub1 = pubs[0][0] if pubs else None
    t_pub2 = pubs[1][0] if len(pubs) > 1 else None
    t_answer = T["answer_end"]
    check = B["check_warm"]
    # A pull's own bound: the blob fetched to a file on the cache's filesystem and fsynced (older
    # results, without that figure: fetched to /dev/null).
    pull_io = B.get("curl_file_warm", B["curl_warm"])
    runs = T["warmup_runs"]  # the agent's check through a pod's server sends as many
    iters = T["warmup_runs"]

    # Compile attempts: every Job of the target; the failed ones' reasons from the Events.
    jobs = json.load(open(os.path.join(d, "jobs.json")))["items"] if os.path.exists(os.path.join(d, "jobs.json")) else [job]
    t_job0 = min(ts(j["metadata"]["creationTimestamp"]) for j in jobs)
    failed = [j["metadata"]["name"] for j in jobs if j["status"].get("failed")]
    why = []
    if os.path.exists(os.path.join(d, "events.json")):
        for e in json.load(open(os.path.join(d, "events.json")))["items"]:
            if e.get("reason") in ("Evicted", "BackoffLimitExceeded", "OOMKilled", "Failed") or e.get("type") == "Warning" and e.get("reason") != "MissingClusterDNS":
                why.append(f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message', '')[:120]}")
    stages = [
        (f"compile: failed attempts ({len(failed)}: first Job created → the succeeded Job created)",
         t_job0, t_job, None, ""),
        ("compile: Job created → source fetched + verified (pod start, stream-hash)", t_job, t_fetched,
         B["src_sha_cold"], "openssl sha256 of the source, cold"),
        ("compile: → engine child compiling", t_fetched, t_compiling, None, ""),
        ("compile: quantise" if t_quant else "compile: (copy, no quantiser)", t_compiling, t_quant or t_compiling, None, ""),
        ("compile: parity + push to the registry", t_quant or t_compiling, t_stored, None, ""),
        ("compile: stored → Job done", t_stored, t_cdone, None, ""),
        ("Job done → agent preparing (operator, agent)", t_cdone, t_prep, None, ""),
        ("agent: pull + verify", t_prep, t_pulled, max(pull_io, B["sha_warm"]),
         "max(curl of the blob to a file + fsync, openssl sha256 cached), warm"),
        ("agent: load (engine child)", t_pulled, t_loaded, B["load_warm"], "llama-server load, warm"),
        ("agent: warm (engine child)", t_loaded, t_ready, iters * check,
         f"{iters} x one completion, warm"),
        ("agent ready → node labelled (operator)", t_ready, t_label, None, ""),
        ("labelled → pod 1 scheduled (scheduler)", t_label, t_sched1, None, ""),
        ("CSI NodePublishVolume, pod 1 (scheduled → published)", t_sched1, t_pub1, B["sha_warm"],
         "openssl sha256 cached, warm"),
        ("serving pod 1: published → Ready (server load, agent's check)", t_pub1, t_ready1,
         B["load_warm"] + runs * check, f"load + the check's {runs} completions, warm"),
        ("first answer through the Service (pod Ready → answer)", t_ready1, t_answer, check,
         "one completion, warm"),
        ("pod 2: scale → scheduled", T["scale"], t_sched2, None, ""),
        ("pod 2: scheduled → CSI published", t_sched2, t_pub2, B["sha_warm"], "openssl sha256 cached, warm"),
        ("pod 2: published → Ready", t_pub2, t_ready2, B["load_warm"] + runs * check,
         f"load + the check's {runs} completions, warm"),
    ]
    procs = ("agent", "engine", "compile", "csi", "llama-server", "registry")
    print(f"\n### {T['size']} GB, {T['variant']}: source {gb(T['source_bytes'])} "
          f"({T['source_type']}), artifact {gb(T['artifact_bytes'])} ({T['artifact_type']})\n")
    print("| stage | wall | bound | ratio | disk read (node) | bridge net | read_bytes per process | "
          "peak RSS per process (sampled) | node used peak (Δ) | page cache peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    walls = {}
    for name, a, b, bound, blabel in stages:
        if a is None or b is None:
            print(f"| {name} | (no signal: start {a}, end {b}) | | | | | | | | |")
            continue
        wall = b - a
        walls[name] = wall
        r = resources(samples, a, b)
        ratio = f"{wall / bound:.1f}x" if bound else "—"
        bcell = f"{bound:.2f} s ({blabel})" if bound is not None else "—"
        rd = ", ".join(f"{k} {gb(v)}" for k, v in r["read"].items() if v > 0) or "0"
        rs = ", ".join(f"{k} {mib(r['rss'][k])}" for k in procs if k in r["rss"])
        print(f"| {name} | {wall:.2f} s | {bcell} | {ratio} | {gb(r['disk'])} | {gb(r['net'])} | {rd} | {rs} | "
              f"{gb(r['used'])} ({'+' if r['used'] >= r['used0'] else ''}{gb(r['used'] - r['used0'])}) | {gb(r['cached'])} |")
    total = (t_answer - t_apply) if t_answer else None
    bsum = pull_io + B["sha_warm"] + B["load_warm"] + check
    bsum_cold = B["curl_cold"] + B["sha_cold"] + B["load_cold"] + check
    pub_s = ", ".join(f"{f.get('seconds', 0):.2f}" for _, f in pubs)
    print()
    print(f"bounds measured after kiln's run on this node: curl of the artifact blob from the registry "
          f"{B['curl_cold']:.2f} s cold / {B['curl_warm']:.2f} s warm; sha256 (openssl dgst, SHA-NI) of the cached artifact "
          f"{B['sha_cold']:.2f} s cold / {B['sha_warm']:.2f} s warm; llama-server start → /health 200 on it "
          f"{B['load_cold']:.2f} s cold / {B['load_warm']:.2f} s warm (peak RSS {mib(B.get('load_rss'))}); "
          f"one completion of the fixture {check:.3f} s; sha256 of the source {B['src_sha_cold']:.2f} s cold "
          f"(cold: after sync; echo 3 > /proc/sys/vm/drop_caches; warm: the same read again at once)")
    print(f"kiln's own figures: pull {pf.get('seconds', 0) if pf else 0:.2f} s for {gb(pf.get('bytes') if pf else None)}; "
          f"engine load {rf.get('load_seconds', 0) if rf else 0:.2f} s, warmup {rf.get('warmup_seconds', 0) if rf else 0:.2f} s; "
          f"CSI publish seconds (the re-hash and bind) {pub_s}; "
          f"NodePublishVolume refused {refused} time(s) before the row was Ready; row peakMemoryBytes "
          f"{mib(row.get('peakMemoryBytes'))}, pullSeconds {row.get('pullSeconds')}")
    if phases:
        print("KilnNode row phases first seen, s after apply: " +
              ", ".join(f"{ph} {t - t_apply:.2f}" for ph, t in sorted(phases.items(), key=lambda x: x[1])))
    if failed or why:
        print(f"compile attempts that failed: {', '.join(failed) or 'none'}; warnings: " + "; ".join(why))
    print(f"first answer: the client's request took {T['answer_end'] - T['answer_start']:.3f} s")
    hw = T.get("hwm", {})
    if hw:
        print("VmHWM at the end (peak over each process's life): " +
              ", ".join(f"{k} {mib(v)}" for k, v in hw.items()))
    if total:
        print(f"**apply → first answer: {total:.1f} s** vs one pull + one hash + one load + one warm: "
              f"{bsum:.2f} s warm ({total / bsum:.1f}x), {bsum_cold:.2f} s cold ({total / bsum_cold:.1f}x)")
    pod2 = (t_ready2 - T["scale"]) if t_ready2 else None
    t_ready2 = t_ready2 or t_answer
    b2 = B["load_warm"] + runs * check
    if pod2:
        print(f"**2nd pod scale → Ready: {pod2:.1f} s** vs its own load + the check {b2:.2f} s warm ({pod2 / b2:.1f}x)")
    g = lambda n: walls.get(n, 0.0)
    comp_t = sum(g(s[0]) for s in stages[:6])
    st = {n: stages[i][0] for n, i in (("pull", 7), ("load", 8), ("warm", 9), ("csi", 12), ("pod", 13), ("answer", 14))}
    r_all = resources(samples, t_apply, t_ready2 or t_answer or t_apply)
    kv = {
        "size": T["size"], "variant": T["variant"], "compile_failures": len(failed), "artifact_mb": round(T["artifact_bytes"] / 1e6),
        "total": f"{total:.1f}" if total else "nan", "bound": f"{bsum:.2f}",
        "ratio": f"{total / bsum:.1f}" if total else "nan",
        "compile": f"{comp_t:.1f}", "pull": f"{g(st['pull']):.2f}", "load": f"{g(st['load']):.2f}",
        "warm": f"{g(st['warm']):.2f}", "csi": f"{g(st['csi']):.2f}",
        "pod_ready": f"{g(st['pod']):.2f}", "answer": f"{g(st['answer']):.2f}",
        "pod2": f"{pod2:.1f}" if pod2 else "nan", "pod2_bound": f"{b2:.2f}",
        "curl": f"{B['curl_warm']:.2f}", "sha": f"{B['sha_warm']:.2f}", "llama_load": f"{B['load_warm']:.2f}",
        "rss_agent": mib(r_all["rss"].get("agent")), "rss_engine": mib(r_all["rss"].get("engine")),
        "rss_csi": mib(r_all["rss"].get("csi")), "rss_llama": mib(r_all["rss"].get("llama-server")),
        "node_used": gb(r_all["used"]), "load0": T["load0"], "load1": T["load1"],
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in kv.items()))


if __name__ == "__main__":
    if sys.argv[1] == "watch":
        watch(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "sample":
        sample(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.25)
    elif sys.argv[1] == "report":
        main_report(sys.argv[2])
    else:
        sys.exit(__doc__)
