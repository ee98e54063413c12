#!/usr/bin/env python3
"""Watches CompiledTargets through one API watch and prints, as Unix time, the moment a
condition first holds; exits 1 if it does not within TIMEOUT seconds. Benchmark helper.

  watch-targets.py rows NS N M TIMEOUT      every one of N targets has M class rows (0: as
                                            many as its classCount says), each Compiling or
                                            Queued (or Compiled)
  watch-targets.py revision NS N REV TIMEOUT  N targets serve revision REV
  watch-targets.py allready NS N TIMEOUT    N targets are Ready=True
  watch-targets.py ready NS NAME REV TIMEOUT  target NAME serves revision REV and is Ready=True

Also prints, on stderr, how many versions of each target it saw at most and, in `ready` mode,
the most versions of NAME within one second (each version is a write: a write storm shows
there)."""

import os
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kubeapi import Api  # noqa: E402

SETTLED = {"Compiling", "Queued", "Compiled"}


def rows_done(m):
    def done(t):
        s = t.get("status") or {}
        rows = s.get("classes") or []
        want = m or s.get("classCount") or -1
        return s.get("classCount") == want and len(rows) == want and all(r.get("phase") in SETTLED for r in rows)

    return done


def ready(rev):
    def done(t):
        s = t.get("status") or {}
        conds = {c["type"]: c["status"] for c in s.get("conditions") or []}
        return (rev is None or s.get("revision") == rev) and conds.get("Ready") == "True"

    return done


def revision(rev):
    return lambda t: (t.get("status") or {}).get("revision") == rev


def main():
    mode, ns = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[-1])
    threading.Timer(timeout, lambda: (print("timeout", file=sys.stderr), os._exit(1))).start()
    if mode == "rows":
        want, done, only = int(sys.argv[3]), rows_done(int(sys.argv[4])), None
    elif mode == "revision":
        want, done, only = int(sys.argv[3]), revision(int(sys.argv[4])), None
    elif mode == "allready":
        want, done, only = int(sys.argv[3]), ready(None), None
    elif mode == "ready":
        want, done, only = 1, ready(int(sys.argv[4])), sys.argv[3]
    else:
        sys.exit(f"unknown mode {mode}")
    api = Api()
    finished, versions, stamps = set(), {}, []
    for kind, obj in api.watch(f"/apis/kiln.dev/v1alpha1/namespaces/{ns}/compiledtargets"):
        name = obj["metadata"]["name"]
        if only and name != only:
            continue
        versions[name] = versions.get(name, 0) + 1
        if only and kind == "MODIFIED":
            stamps.append(time.time())
        if kind != "DELETED" and done(obj):
            finished.add(name)
        else:
            finished.discard(name)
        if len(finished) >= want:
            print(f"{time.time():.3f}")
            print(f"versions seen per target: max {max(versions.values())}", file=sys.stderr)
            if only:
                per_second = max((sum(1 for u in stamps if t <= u < t + 1) for t in stamps), default=0)
                print(f"{only}: {len(stamps)} writes while watched, at most {per_second} within one second",
                      file=sys.stderr)
            sys.stdout.flush()
            os._exit(0)
    sys.exit("watch ended")


if __name__ == "__main__":
    main()
