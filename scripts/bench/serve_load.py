"""What scripts/bench/serve.sh --load runs in Python, one subcommand each (standard library only,
but `kserve`, which runs in KServe's environment from scripts/ensure/kserve.sh):

    serve_load.py inputs FIXTURE DIR        # DIR/<input>: the fixture's input tensors, raw
                                            # (perf_analyzer --input-data DIR); prints one
                                            # --shape=NAME:D1,D2,... per input
    serve_load.py kserve --model-file F.onnx --model-name NAME --http_port P --enable_grpc false
                                            # KServe's ModelServer on ONNX Runtime, on the source
    serve_load.py config-shim PORT UPSTREAM NAME
                                            # answers Triton's model configuration, forwards the rest
    serve_load.py table RESULTS.tsv CORES   # the summary: medians per model, server and level

Why `kserve`: e2e/testdata/kserve_onnx.py serves kiln's optimised artifact as kiln's engine
opens it (one intra-op thread, no optimisation at load, JSON outputs); a benchmark against the
source wants ONNX Runtime as a KServe user gets it: the .onnx source, ONNX Runtime's default
optimisation and threads, and binary outputs when the client asks for them (as it may for
inputs). Its wrapper and datatypes are reused from that file.

Why `config-shim`: perf_analyzer (service kind triton) reads GET /v2/models/NAME/config, Triton's
model configuration extension, before any load, and stops when it is missing; the v2 protocol
itself has no such route. KServe's server above answers it in process. For a server that does
not, this relays every connection to it and answers only that route, from the server's own v2
metadata (max_batch_size 0: the shapes are whole). Inference requests are spliced through in
the kernel (about 0.2 ms of its CPU per squeezenet request, against 25 ms of the server's).
serve.sh puts both servers behind it when kiln needs it, so the extra hop is the same for both.
"""
import fcntl
import json
import os
import re
import socket
import statistics
import struct
import sys
import threading
import urllib.request

SAFETENSORS_DTYPES = {"F32", "F64", "F16", "I64", "I32", "I8", "U8", "BOOL"}
TRITON_TYPES = {"FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "FP16": "TYPE_FP16", "INT64": "TYPE_INT64",
                "INT32": "TYPE_INT32", "INT8": "TYPE_INT8", "UINT8": "TYPE_UINT8", "BOOL": "TYPE_BOOL",
                "BYTES": "TYPE_STRING"}
CONFIG_PATH = re.compile(r"^/v2/models/([^/]+)(/versions/[^/]+)?/config$")


def inputs(fixture, out):
    """The fixture's input/NAME tensors as raw files named NAME (its first and only sample)."""
    raw = open(fixture, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    os.makedirs(out, exist_ok=True)
    for name, t in sorted(header.items()):
        if not name.startswith("input/"):
            continue
        if t["dtype"] not in SAFETENSORS_DTYPES:
            sys.exit(f"{fixture}: input {name} has dtype {t['dtype']}, not one perf_analyzer sends raw")
        start, end = t["data_offsets"]
        with open(os.path.join(out, name[len("input/"):]), "wb") as f:
            f.write(raw[8 + n + start:8 + n + end])
        print(f"--shape={name[len('input/'):]}:{','.join(str(d) for d in t['shape'])}")


def triton_config(name, metadata):
    """Triton's model configuration (the part perf_analyzer reads) from v2 metadata."""
    def tensors(items):
        return [{"name": t["name"], "data_type": TRITON_TYPES.get(t["datatype"], t["datatype"]),
                 "dims": t["shape"]} for t in items]
    return {"name": name, "platform": metadata.get("platform", ""), "max_batch_size": 0,
            "input": tensors(metadata["inputs"]), "output": tensors(metadata["outputs"])}


def kserve_main():
    """KServe's ModelServer on ONNX Runtime's defaults, on an .onnx source, with /config."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../e2e/testdata"))
    import argparse

    import kserve
    import kserve_onnx
    import onnxruntime as ort
    from fastapi import APIRouter
    from kserve import InferOutput, InferResponse, ModelServer
    from kserve.protocol.rest import server as rest_server

    class SourceModel(kserve_onnx.OnnxModel):
        def __init__(self, name, path):
            super().__init__(name, os.path.dirname(path))
            self.path = path

        def load(self):
            graph = kserve_onnx.without_dangling_inputs(open(self.path, "rb").read())
            self.session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
            print(f"serve_load kserve: {self.path}, onnxruntime {ort.__version__} (default options), "
                  f"kserve {kserve_onnx.version('kserve')}", flush=True)
            self.ready = True
            return self.ready

        async def predict(self, payload, headers=None, response_headers=None):
            feeds = {i.name: i.as_numpy() for i in payload.inputs}
            names = [o.name for o in self.session.get_outputs()]
            outputs = []
            for name, value in zip(names, self.session.run(names, feeds)):
                out = InferOutput(name=name, shape=list(value.shape),
                                  datatype=kserve_onnx.DATATYPES[f"tensor({kserve_onnx.ort_type(value)})"])
                out.set_data_from_numpy(value, binary_data=payload.use_binary_outputs)
                outputs.append(out)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs,
                                 use_binary_outputs=payload.use_binary_outputs,
                                 requested_outputs=payload.request_outputs)

    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--model-name", required=True)
    args, _ = parser.parse_known_args(sys.argv[2:])
    model = SourceModel(args.model_name, args.model_file)
    model.load()

    register_v2 = rest_server.register_v2_endpoints

    def with_config(app, dataplane, extension):
        router = APIRouter()

        async def config(model_name: str):
            m = {"name": model.name, "platform": "onnxruntime_onnx",
                 "inputs": model.get_input_types(), "outputs": model.get_output_types()}
            return triton_config(model_name, m)

        router.add_api_route("/v2/models/{model_name}/config", config, methods=["GET"])
        app.include_router(router)
        register_v2(app, dataplane, extension)

    rest_server.register_v2_endpoints = with_config
    ModelServer(workers=1).start([model])


def shim(port, upstream, name):
    """Relays each connection to UPSTREAM, answering only GET .../config itself. A connection is
    read request by request while it sends GETs; at its first other request (an inference) the
    rest is spliced through in the kernel, both ways, so the load itself pays two loopback hops
    and no copy through Python."""
    host, up_port = upstream.rsplit(":", 1)
    with urllib.request.urlopen(f"http://{upstream}/v2/models/{name}", timeout=30) as r:
        config = json.dumps(triton_config(name, json.load(r))).encode()
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(config)).encode() + b"\r\n\r\n" + config)
    listener = socket.create_server(("127.0.0.1", port), backlog=1024)
    print(f"serve_load config-shim: 127.0.0.1:{port} -> {upstream}", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=connection, args=(client, (host, int(up_port)), answer), daemon=True).start()


def connection(client, upstream, answer):
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server = pump = None
    try:
        while client.recv(4, socket.MSG_PEEK | socket.MSG_WAITALL) == b"GET ":
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = client.recv(1)
                if not byte:
                    return
                head += byte
            if CONFIG_PATH.match(head.split(b" ", 2)[1].decode("latin-1").split("?")[0]):
                client.sendall(answer)
                continue
            if server is None:
                server, pump = connect(upstream, client)
            server.sendall(head)
        if server is None:
            server, pump = connect(upstream, client)
        spliced(client, server)
    except OSError:
        pass
    finally:
        if pump is not None:
            pump.join(60)  # its descriptors must stay this connection's while it runs
        for s in (client, server):
            if s is not None:
                s.close()


def connect(upstream, client):
    """A connection to the server, and the thread splicing its replies back to the client."""
    server = socket.create_connection(upstream)
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pump = threading.Thread(target=spliced, args=(server, client), daemon=True)
    pump.start()
    return server, pump


def spliced(src, dst):
    """Everything from src to dst through a pipe, in the kernel, until src closes."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        while n := os.splice(src.fileno(), w, 1 << 20):
            while n:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def table(path, cores):
    """One line per model, level and server: medians over the rounds, from serve.sh's rows."""
    rows = [dict(zip(HEADER, line.rstrip("\n").split("\t"))) for line in open(path) if line.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], int(r["level"])), {}).setdefault(r["server"], []).append(r)
    print(f"{'model':<12} {'conc':>4} {'server':<7} {'infer/s':>8} {'min-max':>15} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'failed':>6} {'shed':>5} {'HWM MiB':>8} {'RSS MiB':>8} {'bound/s':>8} "
          f"{'kiln/bound':>10} {'kiln/kserve':>11}")
    for (model, level), servers in groups.items():
        kiln, kserve = summary(servers.get("kiln", [])), summary(servers.get("kserve", []))
        for name, s in (("kiln", kiln), ("kserve", kserve)):
            if s is None:
                continue
            extra = ""
            if name == "kiln":
                bound = bound_of(servers["kiln"][0], level, cores)
                extra = f" {bound:8.1f} {ratio(s['tput'], bound):>10} {ratio(s['tput'], kserve and kserve['tput']):>11}"
                extra += "  " + paired(servers)
            print(f"{model:<12} {level:>4} {name:<7} {num(s['tput'], 1):>8} {s['range']:>15} "
                  f"{num(s['p50'], 2):>8} {num(s['p99'], 2):>8} {s['failed']:>6} {s['shed']:>5} "
                  f"{s['hwm']:8.0f} {s['rss']:8.0f}{extra}")
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['model']} c={r['level']} {r['server']} round {r['round']}: {r['status']}")


def paired(servers):
    """kiln's throughput over KServe's round by round: the range, and the harness's verdict (1.00x)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness  # the shared rules (scripts/bench/harness.py); only the table needs them
    kserve = {r["round"]: float(r["tput"]) for r in servers.get("kserve", []) if r["status"] == "ok"}
    pairs = [float(r["tput"]) / kserve[r["round"]] for r in servers.get("kiln", [])
             if r["status"] == "ok" and kserve.get(r["round"])]
    if not pairs:
        return "paired: no round measured both"
    _, text = harness.verdict(pairs, 1.0, "kiln", "kserve")
    return f"paired {harness.ratio_range(min(pairs), max(pairs))} ({len(pairs)} rounds): {text}"


def summary(rs):
    """Medians of the rounds that measured, how many failed, the shed total, the last RSS."""
    if not rs:
        return None
    ok = [r for r in rs if r["status"] == "ok"]
    tput = [float(r["tput"]) for r in ok]
    counted = [int(r["shed"]) for r in rs if r["shed"].isdigit()]

    def ms(key):
        return statistics.median(float(r[key]) for r in ok) / 1000 if ok else None

    return {"tput": statistics.median(tput) if tput else None,
            "range": f"{min(tput):.1f}-{max(tput):.1f}" if tput else "-",
            "p50": ms("p50_us"), "p99": ms("p99_us"), "failed": len(rs) - len(ok),
            "shed": sum(counted) if counted else "-",
            "hwm": int(rs[-1]["hwm_kib"] or 0) / 1024, "rss": int(rs[-1]["rss_kib"] or 0) / 1024}


def num(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}x"


def bound_of(row, level, cores):
    """The engine alone: one request per core for tract, one at a time on all cores otherwise."""
    p50 = float(row["engine_p50_s"])
    return (min(level, cores) if row["engine"].startswith("tract") else 1) / p50


HEADER = ["model", "server", "level", "round", "status", "tput", "p50_us", "p99_us", "shed",
          "hwm_kib", "rss_kib", "engine", "engine_p50_s"]


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "inputs" and len(sys.argv) == 4:
        inputs(sys.argv[2], sys.argv[3])
    elif cmd == "kserve":
        kserve_main()
    elif cmd == "config-shim" and len(sys.argv) == 5:
        shim(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif cmd == "table" and len(sys.argv) == 4:
        table(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
