#!/usr/bin/env python3
"""Helpers of e2e/bench/sizes-faults.sh (standard library only): the three fault injectors, each
a tight loop over /proc, the node cache and the containers' log files, so that a fault lands
inside a window of a fraction of a second, and each writing what it saw as JSON.

    sizes-faults.py agent-kill LOGDIR CACHE MIN MAX TIMEOUT OUT
        Follows the agent container's log files (LOGDIR/<restart>.log, CRI format, JSON lines)
        and samples the bytes through the pod bridge cni0 (sizes-lib.py's counter, every 10 ms).
        At the first `pulling` line whose percent is in [MIN, MAX], SIGKILLs the `kiln-agent run`
        process; then measures the partial file it kept (CACHE/tmp/pull-*/.kiln-partial-*), and
        follows the restarted container until its `artifact pulled and verified`. OUT: the kill,
        the kept bytes, the new agent's `resuming a pull` bytes, the bridge bytes from the first
        agent's `preparing` to the new agent's `artifact pulled and verified`, its log lines.
    sizes-faults.py csi-kill CACHE SIZE MIN_FRACTION TIMEOUT OUT
        Polls CACHE/published/ every 2 ms; once a volume's directory holds its artifact link but
        no kiln.json (the publish is building and hashing it) and the plugin has read
        MIN_FRACTION of SIZE bytes since (its /proc/PID/io rchar), SIGKILLs `kiln-csi`.
        OUT: the volume, what its directory held, the plugin's bytes read, the mounts then.
    sizes-faults.py llama-kill EXCLUDE_UIDS PORT TIMEOUT OUT
        Waits for a llama-server process of a pod not in EXCLUDE_UIDS (comma-separated; the pod
        uid from its cgroup), then polls its /health inside the pod's network namespace and its
        /proc/PID/maps; once it answers 503 (loading the model) with /model/artifact mapped (or
        has answered 503 for half a second), SIGKILLs it; a 200 first is a miss. OUT: the pod
        uid, the evidence, the observations.

    sizes-faults.py serving-check AGENT_LOG PODS_WATCH KILLED_UID NEW_UID T_KILL OUT
        Row 3's evidence: each pod's checks by the agent and their outcomes, and its Ready as the
        pods' watch saw it.

The injectors exit 0 when the fault landed in its window, 3 when the window was missed (said in OUT's
"missed"), 2 on a timeout.
"""
import glob
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

_spec = importlib.util.spec_from_file_location(
    "sizes_lib", os.path.join(os.path.dirname(os.path.abspath(__file__)), "sizes-lib.py"))
L = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(L)


def pids_of(role, known=None):
    """The pids whose role (sizes-lib.py role_of) is `role`. `known` (pid -> role), when given,
    caches the roles found."""
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d[6:])
        if known is not None and pid in known:
            r = known[pid]
        else:
            r = L.role_of_pid(d)
            # (only a role is remembered: a container's process is `runc init` before its exec)
            if known is not None and r is not None:
                known[pid] = r
        if r == role:
            out.append(pid)
    return out


def alive(pid):
    st = L.read(f"/proc/{pid}/status")
    return bool(st) and not re.search(r"^State:\s+[ZX]", st, re.M)


def wait_gone(pid, secs=10):
    end = time.time() + secs
    while alive(pid) and time.time() < end:
        time.sleep(0.002)
    return not alive(pid)


def rchar(pid):
    m = re.search(r"^rchar:\s+(\d+)", L.read(f"/proc/{pid}/io") or "", re.M)
    return int(m.group(1)) if m else None


def mounts(needle):
    """Mounts whose mount point contains `needle`: [(mount point, ro|rw)]."""
    out = []
    for line in (L.read("/proc/self/mountinfo") or "").splitlines():
        f = line.split()
        if len(f) > 5 and needle in f[4]:
            out.append((f[4], f[5].split(",")[0]))
    return out


class Follow:
    """New JSON lines of a container's log files (DIR/<restart count>.log, CRI format:
    `TIME STREAM P|F CONTENT`, P a partial line continued by the next)."""

    def __init__(self, d):
        self.d, self.off, self.part = d, {}, {}

    def generations(self):
        gens = []
        for f in glob.glob(os.path.join(self.d, "*.log")):
            b = os.path.basename(f)[:-4]
            if b.isdigit():
                gens.append(int(b))
        return sorted(gens)

    def lines(self):
        out = []
        for gen in self.generations():
            path = os.path.join(self.d, f"{gen}.log")
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.off.get(gen, 0))
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.off[gen] = self.off.get(gen, 0) + end + 1
            for raw in data[:end].split(b"\n"):
                parts = raw.split(b" ", 3)
                if len(parts) < 4:
                    continue
                if parts[2] == b"P":
                    self.part[gen] = self.part.get(gen, b"") + parts[3]
                    continue
                content = self.part.pop(gen, b"") + parts[3]
                try:
                    j = json.loads(content)
                except ValueError:
                    continue
                fields = j.get("fields", {})
                out.append((gen, L.ts(j.get("timestamp")) or time.time(), fields.get("message", ""),
                            fields, j.get("level", "")))
        return out


def write(out, res):
    with open(out + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(out + ".tmp", out)


def agent_kill(logdir, cache, lo, hi, timeout, out):
    lo, hi, timeout = float(lo), float(hi), float(timeout)
    res = {"missed": None, "kill": None, "kept": None, "resumed": None, "lines": [], "net": None}
    end = time.time() + timeout
    while not os.path.isdir(logdir) and time.time() < end:
        time.sleep(0.05)
    follow = Follow(logdir)
    gens = follow.generations()
    gen0 = gens[-1] if gens else 0
    regs = pids_of("registry")
    reg = regs[0] if regs else None
    agents = pids_of("agent")
    if len(agents) != 1:
        res["missed"] = f"want one `kiln-agent run` process, found {agents}"
        write(out, res)
        return 3
    pid = agents[0]
    samples = []  # (time, cni0 rx+tx)
    t_prep = t_pulled = None
    state = "before"
    after_done = None
    rc = 2
    while time.time() < end:
        t = time.time()
        n = L.bridge_bytes(reg)
        if n is not None:
            samples.append((t, n))
        for gen, ts, msg, f, level in follow.lines():
            keep = msg in ("preparing", "pulling", "resuming a pull from the bytes an earlier one kept",
                           "download resumed by range; verifying the whole object", "ready") \
                or msg.startswith("artifact pulled and verified") or level in ("WARN", "ERROR")
            if keep:
                res["lines"].append({"gen": gen, "t": ts, "level": level, "message": msg,
                                     **{k: v for k, v in f.items() if k != "message"}})
            if msg == "preparing" and gen == gen0 and t_prep is None:
                t_prep = ts
            artifact = str(f.get("what", "")).startswith("artifact")
            if state == "before" and gen == gen0:
                if msg == "pulling" and artifact:
                    pct = f.get("percent", 0)
                    if lo <= pct <= hi:
                        if not alive(pid):
                            res["missed"] = f"the agent process {pid} is gone before the kill"
                            state = "missed"
                            break
                        os.kill(pid, signal.SIGKILL)
                        res["kill"] = {"t": time.time(), "pid": pid, "percent": pct,
                                       "bytes": f.get("bytes"), "total": f.get("total"),
                                       "line_t": ts}
                        wait_gone(pid)
                        kept = [(p, os.path.getsize(p)) for p in
                                glob.glob(os.path.join(cache, "tmp", "pull-*", ".kiln-partial-*"))]
                        res["kept_files"] = kept
                        res["kept"] = max((s for _, s in kept), default=0)
                        state = "killed"
                    elif pct > hi:
                        res["missed"] = f"the first pulling line in the window came at {pct}% (over {hi}%)"
                        state = "missed"
                        break
                elif msg.startswith("artifact pulled and verified"):
                    res["missed"] = "the pull finished before a pulling line in the window"
                    state = "missed"
                    break
            if state == "killed" and gen > gen0:
                if msg == "resuming a pull from the bytes an earlier one kept" and artifact and res["resumed"] is None:
                    res["resumed"] = f.get("bytes")
                if msg.startswith("artifact pulled and verified") and t_pulled is None:
                    t_pulled = ts
                    res["pulled"] = {"t": ts, "gen": gen, "bytes": f.get("bytes"), "seconds": f.get("seconds")}
                    after_done = time.time() + 0.3
        if state == "missed":
            rc = 3
            break
        if after_done and time.time() >= after_done:
            rc = 0
            break
        time.sleep(0.01)
    if state == "killed" and t_pulled is None:
        res["missed"] = res["missed"] or f"no `artifact pulled and verified` from a restarted agent within {timeout:.0f} s"
        rc = 2
    res["t_prep"] = t_prep
    if samples and t_prep and t_pulled:
        before = [s for s in samples if s[0] <= t_prep]
        after = [s for s in samples if s[0] >= t_pulled]
        n0 = before[-1] if before else samples[0]
        n1 = after[0] if after else samples[-1]
        res["net"] = {"bytes": n1[1] - n0[1], "t0": n0[0], "t1": n1[0]}
    res["samples"] = len(samples)
    write(out, res)
    return rc


def csi_kill(cache, size, frac, timeout, out):
    size, frac, timeout = int(size), float(frac), float(timeout)
    res = {"missed": None, "kill": None}
    pub = os.path.join(cache, "published")
    csis = pids_of("csi")
    if len(csis) != 1:
        res["missed"] = f"want one `kiln-csi` process, found {csis}"
        write(out, res)
        return 3
    pid = csis[0]
    r0 = rchar(pid) or 0
    end = time.time() + timeout
    seen = {}
    while time.time() < end:
        try:
            vols = os.listdir(pub)
        except OSError:
            vols = []
        for v in vols:
            d = os.path.join(pub, v)
            t = time.time()
            seen.setdefault(v, t)
            if os.path.exists(os.path.join(d, "kiln.json")):
                res["missed"] = f"volume {v} was complete (kiln.json) {t - seen[v]:.3f} s after it was first seen"
                res["volume"] = v
                write(out, res)
                return 3
            if not os.path.exists(os.path.join(d, "artifact")):
                continue
            read = (rchar(pid) or 0) - r0
            if read < frac * size:
                continue
            os.kill(pid, signal.SIGKILL)
            res["kill"] = {"t": time.time(), "pid": pid, "read": read, "size": size,
                           "since_seen": time.time() - seen[v]}
            wait_gone(pid)
            res["volume"] = v
            try:
                res["held"] = sorted(os.listdir(d))
            except OSError as e:
                res["held"] = str(e)
            res["mounts"] = mounts(v)
            write(out, res)
            return 0
        time.sleep(0.002)
    res["missed"] = f"no publish under way within {timeout:.0f} s"
    write(out, res)
    return 2


def pod_uid(pid):
    m = re.search(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})",
                  L.read(f"/proc/{pid}/cgroup") or "")
    return m.group(1).replace("_", "-") if m else None


def health(pid, port):
    """GET /health inside the network namespace of process `pid`: (status, body's start)."""
    try:
        p = subprocess.run(["nsenter", "-t", str(pid), "-n", "curl", "-s", "-m", "0.5", "-w", "\n%{http_code}",
                            f"http://127.0.0.1:{port}/health"], capture_output=True, text=True, timeout=2)
        body, _, code = p.stdout.rpartition("\n")
        return code.strip() or "000", body[:100]
    except subprocess.TimeoutExpired:
        return "timeout", ""


def llama_kill(exclude, port, timeout, out):
    exclude = set(u for u in exclude.split(",") if u)
    timeout = float(timeout)
    res = {"missed": None, "kill": None, "observed": []}
    end = time.time() + timeout
    known = {}
    pid = uid = None
    while time.time() < end and pid is None:
        for p in pids_of("llama-server", known):
            u = pod_uid(p)
            if u and u not in exclude and alive(p):
                pid, uid = p, u
                break
        else:
            time.sleep(0.005)
    if pid is None:
        res["missed"] = f"no new llama-server process within {timeout:.0f} s"
        write(out, res)
        return 2
    t_seen = time.time()
    t_loading = None
    res.update(pid=pid, uid=uid, t_seen=t_seen)
    while time.time() < end:
        mapped = "/model/artifact" in (L.read(f"/proc/{pid}/maps") or "")
        code, body = health(pid, port)
        res["observed"].append({"t": round(time.time() - t_seen, 3), "health": code, "body": body, "mapped": mapped})
        if not alive(pid):
            res["missed"] = "the server exited before the kill"
            write(out, res)
            return 3
        if code == "200":
            res["missed"] = "the server answered /health 200 (loaded) before a look saw it loading"
            write(out, res)
            return 3
        if code == "503" and t_loading is None:
            t_loading = time.time()
        # Loading: answering 503 with the model mapped (or 503 for half a second).
        if code == "503" and (mapped or time.time() - t_loading >= 0.5):
            os.kill(pid, signal.SIGKILL)
            res["kill"] = {"t": time.time(), "health": code, "body": body, "mapped": mapped,
                           "since_seen": time.time() - t_seen, "since_503": time.time() - t_loading}
            wait_gone(pid)
            write(out, res)
            return 0
        time.sleep(0.005)
    res["missed"] = f"the server neither loading nor loaded within {timeout:.0f} s"
    write(out, res)
    return 2


def serving_check(agent_log, watch, uid2, uid3, t_kill, out):
    """Row 3's verdict inputs from the agent's log (kubectl logs, JSON lines) and the pods' watch
    (sizes-lib.py watch lines: TIME NAME UID READY): for the killed pod (uid2) and its
    replacement (uid3), the agent's checks ("checking a serving pod through its endpoint", its
    server) and their outcomes ("serving pod warm" / "serving pod cold" for that server after
    it), and what the watch saw of each pod's Ready."""
    t_kill = float(t_kill)
    lines = L.log_lines(agent_log)
    res = {}
    for key, uid in (("killed", uid2), ("replacement", uid3)):
        checks = []
        for t, msg, f in lines:
            if msg == "checking a serving pod through its endpoint" and f.get("pod_uid") == uid:
                checks.append({"t": t, "server": f.get("server")})
        for c in checks:
            c["outcome"] = next(({"t": t, "message": msg, "reason": f.get("reason"), "figures": f.get("figures")}
                                 for t, msg, f in lines
                                 if t >= c["t"] and f.get("server") == c["server"]
                                 and msg in ("serving pod warm", "serving pod cold")), None)
        seen = []
        for t, text in L.watched(watch):
            f = text.split()
            if len(f) >= 2 and f[1] == uid:
                seen.append({"t": t, "name": f[0], "ready": f[2] if len(f) > 2 else ""})
        res[key] = {"uid": uid, "checks": checks, "watch": seen,
                    "first_ready": next((s["t"] for s in seen if s["ready"] == "True"), None)}
    res["t_kill"] = t_kill
    write(out, res)
    return 0


if __name__ == "__main__":
    cmds = {"agent-kill": agent_kill, "csi-kill": csi_kill, "llama-kill": llama_kill,
            "serving-check": serving_check}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    sys.exit(cmds[sys.argv[1]](*sys.argv[2:]))
