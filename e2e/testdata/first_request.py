"""A new client's first request to an Open Inference Protocol v2 server against its steady p50,
with NVIDIA's tritonclient[http] (binary tensors), sending a kiln fixture's first sample.

What a new client of a busy Service is: a process whose code already ran (its first call in a
fresh Python process costs tens of milliseconds of its own: imports, first encodings) opening a
new connection, possibly after the server sat idle. So this process first sends one request on
a throwaway client (its own warm-up; the answer is checked), waits IDLE seconds (the server
untouched), then opens a new client and times its first request and the median of N more on it.
Then CLIENTS-1 more new clients, each after 2 s idle, time their first request: one first
request on a 2-core machine that also runs the cluster is one draw of the scheduler, and a
first-request cost that is real shows in every one of them, so their median is the figure.
Prints JSON: {"first": median of the firsts, "firsts": [s, ...] (the first after IDLE first),
"p50": s, "processFirst": s, "idleSeconds": IDLE}.

    python3 first_request.py HOST:PORT MODEL FIXTURE.safetensors [IDLE [N [CLIENTS]]]
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tritonclient.http as http  # noqa: E402
from v2_check import read_fixture  # noqa: E402


def main():
    url, model, fixture = sys.argv[1:4]
    idle = float(sys.argv[4]) if len(sys.argv) > 4 else 12.0
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 30
    clients = int(sys.argv[6]) if len(sys.argv) > 6 else 5
    tensors = read_fixture(fixture)

    def inputs():
        out = []
        for name, arr in sorted(tensors.items()):
            if name.startswith("input/"):
                i = http.InferInput(name[len("input/"):], list(arr.shape), http.np_to_triton_dtype(arr.dtype))
                i.set_data_from_numpy(arr)
                out.append(i)
        return out

    def timed(client):
        ins = inputs()
        started = time.perf_counter()
        result = client.infer(model, ins)
        seconds = time.perf_counter() - started
        for name in tensors:
            if name.startswith("output/") and result.as_numpy(name[len("output/"):]) is None:
                sys.exit(f"no output {name[len('output/'):]}")
        return seconds

    def new_client():
        return http.InferenceServerClient(url=url, network_timeout=60.0)

    process_first = timed(new_client())
    time.sleep(idle)
    client = new_client()
    firsts = [timed(client)]
    p50 = statistics.median(timed(client) for _ in range(n))
    for _ in range(clients - 1):
        time.sleep(2.0)
        firsts.append(timed(new_client()))
    print(json.dumps({
        "first": statistics.median(firsts),
        "firsts": firsts,
        "p50": p50,
        "processFirst": process_first,
        "idleSeconds": idle,
    }))


if __name__ == "__main__":
    main()
