"""table.py OUT: the one table of what `prove.sh run` and `prove.sh anchor` recorded in OUT
(runs/*.json: kiln-agent local outcomes plus the device memory peak; anchor.json: PyTorch),
as Markdown, one row per model, backend variant and precision."""
import glob, json, os, sys

out = sys.argv[1]
ms = lambda d, k: "-" if d.get(k) is None else f"{d[k] * 1e3:.2f}"
mib = lambda b: "-" if b is None else f"{b / 2**20:.0f}"
print("| model | backend | precision | ready | reason | load ms | first ms | p50 ms | p99 ms | parity max abs | placement (nodes; partitions) | host peak MiB | device MiB | message |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
rows = []
for f in sorted(glob.glob(f"{out}/runs/*.json")):
    d = json.load(open(f))
    model, variant, precision = (d["row"].split(".") + ["", ""])[:3]
    if precision.startswith("refused-"):  # the rewritten-manifest cases
        variant, precision = f"{variant}, {precision}", "fp32"
    pl = d.get("placement") or {}
    nodes = ", ".join(f"{k} {v}" for k, v in (pl.get("nodes") or {}).items())
    place = f"{nodes}; {pl.get('partitions')}" if pl else "-"
    parity = d.get("parityMaxAbsError")
    msg = "" if d.get("ready") else str(d.get("message") or "")
    if "FAIL : " in msg:  # ONNX Runtime's own error: what it says after its source location
        msg = msg.split("FAIL : ", 1)[1]
    msg = msg.replace("|", "/").replace("\n", " ")[:140]
    rows.append((model, variant, precision, str(d.get("ready")).lower(), d.get("reason") or "-", ms(d, "loadSeconds"),
                 ms(d, "firstSeconds"), ms(d, "p50Seconds"), ms(d, "p99Seconds"),
                 "-" if parity is None else f"{parity:.2e}", place, mib(d.get("peakMemoryBytes")),
                 str(d.get("deviceMemoryMiB", "-")), msg))
anchor = f"{out}/anchor.json"
if os.path.exists(anchor):
    for model, modes in json.load(open(anchor)).items():
        for mode, (p50, p99) in modes.items():
            rows.append((model, f"PyTorch {mode}", "tf32" if "tf32" in mode else "fp32", "-", "-", "-", "-",
                         f"{p50:.2f}", f"{p99:.2f}", "-", "cuda", "-", "-", ""))
for r in sorted(rows, key=lambda r: (r[0], r[1].startswith("PyTorch"), r[1], r[2])):
    print("| " + " | ".join(r) + " |")
