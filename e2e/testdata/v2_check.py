"""Sends a kiln fixture's first sample through an Open Inference Protocol v2 server with NVIDIA's
tritonclient[http] (binary tensor extension, the client's default) and compares every output
with its golden value within atol + rtol * |golden|. Reads the safetensors fixture itself
(8-byte header length, JSON header, little-endian data), so it needs only the client and numpy.
Prints one JSON line: the outputs' max |error| and the request's latency in seconds. With WARM N
(scripts/bench/serve.sh), then WARM more requests, the first request after them and the median
of N more: "first" and "p50", seconds.

    python v2_check.py HOST:PORT MODEL FIXTURE.safetensors ATOL RTOL [WARM N]
"""
import json
import statistics
import struct
import sys
import time

import numpy as np
import tritonclient.http as http

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
          "I32": np.int32, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_fixture(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        arr = np.frombuffer(raw[8 + n + start:8 + n + end], dtype=DTYPES[t["dtype"]])
        tensors[name] = arr.reshape(t["shape"])
    return tensors


def main():
    url, model, fixture, atol, rtol = sys.argv[1:6]
    atol, rtol = float(atol), float(rtol)
    tensors = read_fixture(fixture)
    inputs, golden = [], {}
    for name, arr in sorted(tensors.items()):
        if name.startswith("input/"):
            i = http.InferInput(name[len("input/"):], list(arr.shape), http.np_to_triton_dtype(arr.dtype))
            i.set_data_from_numpy(arr)
            inputs.append(i)
        elif name.startswith("output/"):
            golden[name[len("output/"):]] = arr
    client = http.InferenceServerClient(url=url, network_timeout=60.0)
    started = time.monotonic()
    result = client.infer(model, inputs)
    seconds = time.monotonic() - started
    worst = 0.0
    for name, want in golden.items():
        got = result.as_numpy(name)
        if got is None or got.shape != want.shape:
            sys.exit(f"output {name}: got {None if got is None else got.shape}, golden {want.shape}")
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        bound = atol + rtol * np.abs(want.astype(np.float64))
        if (err > bound).any():
            sys.exit(f"output {name}: max |error| {err.max():.3e} outside atol {atol} rtol {rtol}")
        worst = max(worst, float(err.max()))
    report = {"maxAbsError": worst, "seconds": seconds}
    if len(sys.argv) > 7:
        warm, n = int(sys.argv[6]), int(sys.argv[7])

        def once():
            t = time.perf_counter()
            client.infer(model, inputs)
            return time.perf_counter() - t

        for _ in range(warm):
            once()
        report["first"] = once()
        report["p50"] = statistics.median(once() for _ in range(n))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
