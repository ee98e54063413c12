"""table.py OUT: the one table of what `prove.sh run`, `graphs` and `anchor` recorded in OUT
(runs/*.json: kiln-agent local outcomes plus the device memory peak; anchor.json: PyTorch),
as Markdown, one row per model, backend variant and precision; then, where both are there, the
p50 of kiln's ONNX Runtime CUDA engines (without and with CUDA graphs) over torch.compile
reduce-overhead's on the same GPU (the target: at most 1.0)."""
import glob, json, os, sys

out = sys.argv[1]
ms = lambda d, k: "-" if d.get(k) is None else f"{d[k] * 1e3:.2f}"
mib = lambda b: "-" if b is None else f"{b / 2**20:.0f}"
print("| model | backend | precision | ready | reason | load ms | first ms | p50 ms | p99 ms | parity max abs | placement (nodes; partitions) | host peak MiB | device MiB | message |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
rows, kiln_p50s = [], {}
for f in sorted(glob.glob(f"{out}/runs/*.json")):
    d = json.load(open(f))
    if d.get("ready") and d.get("p50Seconds") is not None:
        kiln_p50s[d["row"]] = d["p50Seconds"] * 1e3
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
modes_of = json.load(open(anchor)) if os.path.exists(anchor) else {}
if modes_of:
    for model, modes in modes_of.items():
        for mode, (p50, p99) in modes.items():
            rows.append((model, f"PyTorch {mode}", "tf32" if "tf32" in mode else "fp32", "-", "-", "-", "-",
                         f"{p50:.2f}", f"{p99:.2f}", "-", "cuda", "-", "-", ""))
for r in sorted(rows, key=lambda r: (r[0], r[1].startswith("PyTorch"), r[1], r[2])):
    print("| " + " | ".join(r) + " |")
ratios = []
for model, modes in modes_of.items():
    torch_p50 = (modes.get("compile reduce-overhead") or [None])[0]
    for variant in ("ort-cuda", "ort-cuda-graphs"):
        kiln_p50 = kiln_p50s.get(f"{model}.{variant}.fp32")
        if torch_p50 and kiln_p50 is not None:
            ratios.append(f"| {model} | {variant} | {kiln_p50:.2f} | {torch_p50:.2f} | {kiln_p50 / torch_p50:.2f} |")
if ratios:
    print()
    print("| model | kiln engine (fp32) | p50 ms | torch.compile reduce-overhead p50 ms | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(ratios))
