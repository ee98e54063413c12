"""scripts/bench-serve.sh's client: the fixture's first sample through a v2 server with
tritonclient[http] (binary tensor extension), WARM requests first, then the first request after
them and the p50 of N more. Prints {"first": s, "p50": s}.

    python bench_serve_client.py HOST:PORT MODEL FIXTURE.safetensors WARM N
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


def inputs_of(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = []
    for name, t in sorted(header.items()):
        if not name.startswith("input/"):
            continue
        start, end = t["data_offsets"]
        arr = np.frombuffer(raw[8 + n + start:8 + n + end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        i = http.InferInput(name[len("input/"):], list(arr.shape), http.np_to_triton_dtype(arr.dtype))
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def main():
    url, model, fixture, warm, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    client = http.InferenceServerClient(url=url, network_timeout=120.0)
    inputs = inputs_of(fixture)

    def once():
        t = time.perf_counter()
        client.infer(model, inputs)
        return time.perf_counter() - t

    for _ in range(warm):
        once()
    first = once()
    steady = [once() for _ in range(n)]
    print(json.dumps({"first": first, "p50": statistics.median(steady)}))


if __name__ == "__main__":
    main()
