"""What scripts/bench/serve.sh --load's shedding rows run in Python (standard library only):

    serve_shed.py target FIXTURE URL OUT     # OUT: a Vegeta JSON target, the v2 request (binary
                                             # tensors both ways) of the fixture's first sample
    serve_shed.py judge RESULTS FIXTURE SECS # RESULTS: `vegeta encode --to json` lines; prints one
                                             # JSON summary of the run
    serve_shed.py table ROWS                 # ROWS: serve.sh's shed.tsv; a table per model and run

Why: perf_analyzer stops a run at its first refused request, so a server that sheds cannot be
measured with it. Vegeta keeps going and records every answer. The judge splits them: answered
(200, each checked against the fixture's golden outputs: byte for byte against the first right
answer, else element by element within atol 1e-4 + rtol 1e-3 of the golden value), shed (503 or
429 with a Retry-After header: the server said when to come back), and everything else (a wrong
answer, another status, a transport error), and gives the answered requests' p50 and p99.
"""
import base64
import json
import math
import statistics
import struct
import sys

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4), "I8": ("b", 1),
           "U8": ("B", 1), "BOOL": ("?", 1)}
V2_TYPES = {"F32": "FP32", "F64": "FP64", "I64": "INT64", "I32": "INT32", "I8": "INT8",
            "U8": "UINT8", "BOOL": "BOOL"}
ATOL, RTOL = 1e-4, 1e-3


def fixture(path):
    """{name: (dtype, shape, bytes)} for input/* and output/*, the first and only sample."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in FORMATS:
            sys.exit(f"{path}: tensor {name} has dtype {t['dtype']}, which this judge does not read")
        start, end = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], raw[8 + n + start:8 + n + end])
    return out


def target(fixture_path, url, out):
    """The v2 request with every input binary and every output asked binary, as a Vegeta target."""
    tensors = fixture(fixture_path)
    inputs = sorted((k[len("input/"):], v) for k, v in tensors.items() if k.startswith("input/"))
    head = json.dumps({
        "inputs": [{"name": name, "shape": shape, "datatype": V2_TYPES[dtype],
                    "parameters": {"binary_data_size": len(data)}}
                   for name, (dtype, shape, data) in inputs],
        "parameters": {"binary_data_output": True},
    }).encode()
    body = head + b"".join(data for _, (_, _, data) in inputs)
    with open(out, "w") as f:  # one target a line, as Vegeta reads them
        f.write(json.dumps({"method": "POST", "url": url, "body": base64.b64encode(body).decode(),
                            "header": {"Content-Type": ["application/octet-stream"],
                                       "Inference-Header-Content-Length": [str(len(head))]}}) + "\n")


def outputs(body, header_length):
    """{name: bytes} of a v2 binary answer."""
    n = int(header_length)
    head = json.loads(body[:n])
    tail, at, got = body[n:], 0, {}
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            raise ValueError(f"output {o['name']} came back as JSON, not binary")
        got[o["name"]] = tail[at:at + size]
        at += size
    return got


def close(got, golden):
    """Every output present and each element within atol + rtol * |golden|."""
    for name, (dtype, _, want) in golden.items():
        have = got.get(name)
        if have is None or len(have) != len(want):
            return False
        fmt, size = FORMATS[dtype]
        count = len(want) // size
        for a, b in zip(struct.unpack(f"<{count}{fmt}", have), struct.unpack(f"<{count}{fmt}", want)):
            if not (abs(float(a) - float(b)) <= ATOL + RTOL * abs(float(b))
                    or (isinstance(a, float) and math.isnan(a) and math.isnan(b))):
                return False
    return True


def header(result, name):
    for k, v in (result.get("headers") or {}).items():
        if k.lower() == name.lower():
            return v[0] if v else ""
    return None


def judge(results, fixture_path, window_s):
    golden = {k[len("output/"):]: v for k, v in fixture(fixture_path).items() if k.startswith("output/")}
    right_body = None
    answered, shed, other, wrong, bodies_checked = [], 0, {}, 0, 0
    for line in open(results):
        r = json.loads(line)
        code = r["code"]
        if code == 200:
            body = base64.b64decode(r.get("body") or "")
            ok = body == right_body
            if not ok:
                try:
                    ok = close(outputs(body, header(r, "Inference-Header-Content-Length")), golden)
                except (ValueError, TypeError, KeyError, json.JSONDecodeError):
                    ok = False
                bodies_checked += 1
                if ok and right_body is None:
                    right_body = body
            if ok:
                answered.append(r["latency"] / 1e9)
            else:
                wrong += 1
        elif code in (429, 503) and header(r, "Retry-After"):
            shed += 1
        else:
            why = f"{code} {r.get('error') or ''}".strip()
            other[why] = other.get(why, 0) + 1
    answered.sort()

    def pct(q):
        return answered[min(len(answered) - 1, math.ceil(q * len(answered)) - 1)] if answered else None

    print(json.dumps({"answered": len(answered), "shed": shed, "wrong": wrong, "other": other,
                      "p50_s": statistics.median(answered) if answered else None,
                      "p99_s": pct(0.99), "max_s": answered[-1] if answered else None,
                      "decoded": bodies_checked, "window_s": window_s}))


RUNS = ("idle", "overload", "storm")


def table(path):
    """Per model and run: answers a second, their p50 and p99 (medians over the rounds, with the
    range), shed a second, wrong answers, other failures, the client's cores; and the run's p99
    over the same round's idle p50, with the goal (<= 4x) judged on the overload run."""
    rounds = {}
    for line in open(path):
        model, rnd, run, summary, hwm, rss = line.rstrip("\n").split("\t")
        rounds.setdefault(model, {}).setdefault(rnd, {})[run] = (json.loads(summary), int(hwm))
    print("| model | run | answered/s | p50 ms | p99 ms | shed/s | wrong | other | client cores "
          "| p99 / idle p50 (range) | goal <= 4x | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model, by_round in rounds.items():
        for run in RUNS:
            runs = [r[run] for r in by_round.values() if run in r]
            if not runs:
                continue
            s = [x[0] for x in runs]
            ratios = [r[run][0]["p99_s"] / r["idle"][0]["p50_s"] for r in by_round.values()
                      if run in r and "idle" in r and r[run][0]["p99_s"] and r["idle"][0]["p50_s"]]
            ratio = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            verdict = "-"
            if run == "overload" and ratios:
                verdict = "met" if max(ratios) <= 4 else "missed" if min(ratios) > 4 else "inconclusive"
            print(f"| {model} | {run} | {median(x['answered'] / x['window_s'] for x in s):.1f} | "
                  f"{spread(s, 'p50_s')} | {spread(s, 'p99_s')} | "
                  f"{median(x['shed'] / x['window_s'] for x in s):.0f} | {sum(x['wrong'] for x in s)} | "
                  f"{sum(sum(x['other'].values()) for x in s)} | {median(x['client_cores'] for x in s):.2f} | "
                  f"{ratio if run != 'idle' else '-'} | {verdict} | {max(x[1] for x in runs) / 1024:.0f} |")


def median(values):
    return statistics.median(list(values))


def spread(summaries, key):
    """The median of a latency over the rounds, in ms, with its range."""
    vals = [x[key] * 1e3 for x in summaries if x[key] is not None]
    return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})" if vals else "-"


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "target" and len(sys.argv) == 5:
        target(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "judge" and len(sys.argv) == 5:
        judge(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif cmd == "table" and len(sys.argv) == 3:
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
