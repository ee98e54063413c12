"""`kiln-agent serve` on one stored artifact of a `kiln-agent local` run, as a serving pod runs it:
the store entry laid out as a csi.kiln.dev volume holds it (artifact, manifest.json,
fixture.safetensors, kiln.json), the server started on it, every fixture sample sent through its
Open Inference Protocol v2 REST endpoint as JSON tensors, each output compared with its golden
value within atol + rtol * |golden|, then WARM more requests, and the first and the median
latency of N more. Prints one JSON line (also written to OUT): ready, the engine the server
reports (`platform`), the largest error, load-to-ready seconds, first and p50 ms, and the
server's last log lines when it failed. Standard library only, so it runs wherever prove.sh does
(the GPU machine has no network for a v2 client).

    python3 serve_check.py AGENT ENTRY_DIR FIXTURE.safetensors OUT.json [ATOL RTOL WARM N]
"""
import hashlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

FORMATS = {"F32": ("f", "FP32"), "F64": ("d", "FP64"), "F16": ("e", "FP16"), "I64": ("q", "INT64"),
           "I32": ("i", "INT32"), "I8": ("b", "INT8"), "U8": ("B", "UINT8"), "BOOL": ("?", "BOOL")}


def read_fixture(path):
    """Samples as [(inputs, outputs)], each {name: (dtype, shape, values)}."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    samples = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        parts = key.split("/")
        k, side, name = (0, parts[0], parts[1]) if len(parts) == 2 else (int(parts[0][6:]), parts[1], parts[2])
        start, end = t["data_offsets"]
        fmt = FORMATS[t["dtype"]][0]
        data = raw[8 + n + start:8 + n + end]
        values = list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))
        samples.setdefault(k, ({}, {}))[0 if side == "input" else 1][name] = (t["dtype"], t["shape"], values)
    return [samples[k] for k in sorted(samples)]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def volume(entry, fixture, into):
    """The store entry as the node plugin lays a volume out (kiln_crds::mounted)."""
    manifest = json.load(open(os.path.join(entry, "manifest.json")))
    for name in ("artifact", "manifest.json"):
        os.symlink(os.path.join(entry, name), os.path.join(into, name))
    os.symlink(os.path.abspath(fixture), os.path.join(into, "fixture.safetensors"))
    info = {"namespace": "gpu", "target": "served", "revision": 1, "class": "gpu-prove",
            "digest": sha256(os.path.join(entry, "artifact")), "engine": manifest.get("backend"),
            "mediaType": manifest.get("mediaType", ""), "fixture": sha256(fixture), "node": socket.gethostname(),
            "pod": "gpu/prove"}
    json.dump(info, open(os.path.join(into, "kiln.json"), "w"))


def call(url, body=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def infer(base, inputs):
    body = {"inputs": [{"name": k, "shape": s, "datatype": FORMATS[d][1], "data": v}
                       for k, (d, s, v) in inputs.items()]}
    started = time.perf_counter()
    answer = call(f"{base}/v2/models/served/infer", body)
    return {o["name"]: o["data"] for o in answer["outputs"]}, time.perf_counter() - started


def worst_error(got, golden, atol, rtol):
    worst = 0.0
    for name, (_, _, want) in golden.items():
        have = got[name]
        for a, g in zip(have, want):
            err = abs(a - g)
            if err > atol + rtol * abs(g):
                raise ValueError(f"output {name}: |{a} - {g}| = {err} over the tolerance")
            worst = max(worst, err)
    return worst


def main():
    agent, entry, fixture, out = sys.argv[1:5]
    atol, rtol, warm, n = (float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])) \
        if len(sys.argv) > 8 else (1e-3, 1e-3, 20, 100)
    result = {"ready": False}
    with tempfile.TemporaryDirectory() as d:
        volume(entry, fixture, d)
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        p = port.getsockname()[1]
        port.close()
        log = open(os.path.join(d, "serve.log"), "w+")
        started = time.perf_counter()
        server = subprocess.Popen([agent, "serve", "--model-dir", d, "--host", "127.0.0.1", "--port", str(p)],
                                  stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{p}"
        try:
            while server.poll() is None and time.perf_counter() - started < 300:
                try:
                    call(f"{base}/v2/health/ready")
                    break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.1)
            result["readySeconds"] = time.perf_counter() - started
            result["platform"] = call(f"{base}/v2/models/served")["platform"]
            samples = read_fixture(fixture)
            worst, latencies = 0.0, []
            for i in range(len(samples) + warm + 1 + n):
                inputs, golden = samples[i % len(samples)]
                got, seconds = infer(base, inputs)
                worst = max(worst, worst_error(got, golden, atol, rtol))
                latencies.append(seconds)
            after = latencies[len(samples) + warm:]
            result.update(ready=True, maxAbsError=worst, firstMs=latencies[0] * 1e3,
                          firstAfterWarmMs=after[0] * 1e3, p50Ms=statistics.median(after[1:]) * 1e3,
                          requests=len(latencies))
        except Exception as e:  # the row says why
            result["message"] = f"{type(e).__name__}: {e}"
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.seek(0)
            if not result["ready"]:
                result["serverLog"] = log.read()[-2000:]
    json.dump(result, open(out, "w"))
    print(json.dumps({k: v for k, v in result.items() if k != "serverLog"}))
    sys.exit(0 if result["ready"] else 1)


if __name__ == "__main__":
    main()
