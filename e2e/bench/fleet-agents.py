#!/usr/bin/env python3
"""Simulated kiln agents for e2e/bench/fleet.sh: Nodes and KilnNodes written the way kiln-agent
writes them (the KilnNode created owned by its Node, its whole status server-side applied with
field manager `kiln-agent`, forced), with no kubelet and no engine. Benchmark helper.

  fleet-agents.py nodes NODES POOLS CLASSES     create the Nodes (pool label kiln-bench/pool,
                                                every class key a label) and their KilnNodes
                                                with hardware facts
  fleet-agents.py ready NS NODES POOLS          every node reports Ready rows for every target
                                                that selects it, at the target's revision
  fleet-agents.py roll NS NODES POOLS TARGET REV RATE
                                                TARGET's revision REV rolls across the nodes,
                                                RATE nodes per second starting (each reports
                                                Pulling, then Ready a second later); prints the
                                                Unix time the last Ready row was written

Targets: t-0 selects every node; t-i (i >= 1) selects pool i % POOLS."""

import concurrent.futures
import os
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kubeapi import Api  # noqa: E402

KILN = "/apis/kiln.dev/v1alpha1"
WORKERS = 8


def node_name(i):
    return f"fleet-{i:04d}"


def pool_of(i, pools):
    return f"p{i % pools}"


def product(i, classes):
    return f"FLEET-GPU-{i % classes}"


def hardware(gpu):
    return {
        "arch": "amd64",
        "cpuLevel": "x86-64-v3",
        "cpuFeatures": ["avx2", "fma"],
        "cores": 64,
        "memoryBytes": 549755813888,
        "driverVersion": "580.159.04",
        "cudaDriverVersion": "13.0",
        "accelerators": [
            {"product": gpu, "computeMajor": 9, "computeMinor": 0, "memoryBytes": 85899345920}
        ],
        "runtimes": {"tract": "0.23.9"},
    }


def run_all(fn, items):
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        for r in pool.map(fn, items):
            if r is not None:
                sys.exit(r)


def nodes(api, count, pools, classes):
    def one(i):
        name = node_name(i)
        labels = {
            "kiln-bench/pool": pool_of(i, pools),
            "kubernetes.io/arch": "amd64",
            "kiln.dev/cpu-level": "x86-64-v3",
            "nvidia.com/gpu.product": product(i, classes),
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/cuda.driver-version.major": "580",
        }
        code, node = api.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                          "metadata": {"name": name, "labels": labels}})
        if code == 409:
            code, node = api.request("GET", f"/api/v1/nodes/{name}")
        if code >= 300:
            return f"node {name}: HTTP {code} {node}"
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
        body = {"apiVersion": "kiln.dev/v1alpha1", "kind": "KilnNode",
                "metadata": {"name": name, "ownerReferences": [owner]}, "spec": {}}
        code, out = api.request("POST", f"{KILN}/kilnnodes", body)
        if code >= 300 and code != 409:
            return f"kilnnode {name}: HTTP {code} {out}"
        return apply(api, name, {"hardware": hardware(product(i, classes))})

    run_all(one, range(count))


def apply(api, name, status):
    body = {"apiVersion": "kiln.dev/v1alpha1", "kind": "KilnNode", "status": status}
    code, out = api.apply_status(f"{KILN}/kilnnodes/{name}", body, "kiln-agent")
    if code >= 300:
        return f"kilnnode {name} status: HTTP {code} {out}"
    return None


def row(ns, target, revision, cls, phase, digest):
    r = {"namespace": ns, "name": target, "revision": revision, "class": cls, "phase": phase,
         "desiredRevision": revision}
    if phase == "Ready":
        r.update({"artifactDigest": digest, "pullSeconds": 1.25, "pullBytes": 5000000,
                  "loadSeconds": 0.31, "warmupSeconds": 0.42, "p50Seconds": 0.0041,
                  "parityMaxAbsError": 1.2e-6, "peakMemoryBytes": 402653184, "engine": "tract",
                  "readySince": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return r


class Fleet:
    """What each node's agent would know: its class label, and per target the revision and the
    class's artifact digest (read from the targets' statuses, as an agent reads them)."""

    def __init__(self, api, ns, count, pools):
        self.api, self.ns, self.count, self.pools = api, ns, count, pools
        code, lst = api.request("GET", "/api/v1/nodes?labelSelector=kiln-bench/pool")
        labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in lst["items"]}
        self.cls = {n: v.get("kiln.dev/class", "") for n, v in labels.items()}
        self.gpu = {n: v.get("nvidia.com/gpu.product", "") for n, v in labels.items()}
        code, lst = api.request("GET", f"{KILN}/namespaces/{ns}/compiledtargets")
        self.targets = {}
        for t in lst["items"]:
            s = t.get("status") or {}
            digests = {c["class"]: c.get("artifactDigest") for c in s.get("classes") or []}
            self.targets[t["metadata"]["name"]] = (s.get("revision") or 0, digests)
        self.rows = {}
        self.lock = threading.Lock()

    def selects(self, target, i):
        k = int(target.split("-")[1])
        return k == 0 or pool_of(k, self.pools) == pool_of(i, self.pools)

    def ready_rows(self, i):
        name = node_name(i)
        out = {}
        for t, (rev, digests) in sorted(self.targets.items()):
            if self.selects(t, i):
                cls = self.cls.get(name, "")
                out[t] = row(self.ns, t, rev, cls, "Ready", digests.get(cls))
        return out

    def write(self, i, rows):
        name = node_name(i)
        return apply(self.api, name, {"hardware": hardware(self.gpu[name]), "targets": list(rows.values())})


def ready(api, ns, count, pools):
    fleet = Fleet(api, ns, count, pools)
    run_all(lambda i: fleet.write(i, fleet.ready_rows(i)), range(count))


def roll(api, ns, count, pools, target, rev, rate):
    fleet = Fleet(api, ns, count, pools)
    _, digests = fleet.targets[target]
    last = [0.0]
    start = time.time()

    def one(i):
        rows = fleet.ready_rows(i)
        cls = fleet.cls.get(node_name(i), "")
        # Pacing: node i starts at start + i / rate.
        delay = start + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        rows[target] = row(ns, target, rev, cls, "Pulling", None)
        err = fleet.write(i, rows)
        if err:
            return err
        time.sleep(1.0)
        rows[target] = row(ns, target, rev, cls, "Ready", digests.get(cls))
        err = fleet.write(i, rows)
        with fleet.lock:
            last[0] = max(last[0], time.time())
        return err

    with concurrent.futures.ThreadPoolExecutor(max(WORKERS, int(rate * 2) + 2)) as pool:
        for r in pool.map(one, range(count)):
            if r is not None:
                sys.exit(r)
    print(f"{last[0]:.3f}")


def main():
    api = Api()
    cmd = sys.argv[1]
    if cmd == "nodes":
        nodes(api, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "ready":
        ready(api, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "roll":
        roll(api, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), float(sys.argv[7]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
