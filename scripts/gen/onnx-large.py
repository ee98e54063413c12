#!/usr/bin/env python3
"""Writes an ONNX model of about a requested size whose weights live in ONNX external data, for
checking what kiln does with models over protobuf's 2 GB limit: seeded random weights in a stack
of MatMul + Add(bias) + Relu blocks (opset 17, IR version 8), input `x` [batch, d] f32 (batch
symbolic), output `y` [batch, d].

    scripts/gen/onnx-large.py --size-gb 2.5 --out /var/cache/kiln/onnx-large/2.5gb/model.onnx
    scripts/gen/onnx-large.py --size-gb 0.1 --out DIR/model.onnx [--seed 1] [--batch 2]
        [--fixture FILE] [--spec FILE --backend tract|onnxruntime]

Writes DIR/model.onnx (the graph, a few KB) and DIR/model.onnx.data (every initializer, one file
beside it: `onnx.save_model(..., save_as_external_data=True, all_tensors_to_one_file=True,
location="model.onnx.data", size_threshold=0)`, so even a 0.1 GB model keeps its weights
outside the protobuf, as a 2 GB one must), and a warmup fixture in kiln's layout (default
DIR/model.onnx.fixture-v1.safetensors): `input/x` (seeded normals, [--batch, d]) and the golden
`output/y`, computed here in float64 numpy and rounded to f32, with the `kiln.fixture` metadata
map (version v1, the sha256 of model.onnx, atol/rtol 1e-3) that `kiln-agent fixtures` writes.
With --spec, also a `kiln-agent local` YAML (ModelArtifact + CompiledTarget) beside nothing but
these files: source model.onnx by sha256 and size, the data file as an asset (`kind: other`,
named like the location the graph refers to, by sha256 and size: a size is what lets a file over
the 1 GiB fetch limit of undeclared sizes through), the fixture, one profile {batch: --batch}.

The shape is chosen for the size: the narrowest width d (a multiple of 256) whose block count
stays at most d/64; a block holds d*d + d f32 values. Weights are numpy PCG64 normals (the bit
stream is stable across numpy versions) with He scaling, std sqrt(2/d), and biases std 0.01, so
the Relu activations keep a mean square of about 1 block after block (checked: the script fails
if the golden output's RMS leaves [0.05, 20]). Size and shape are printed on stderr.

Runs in its own virtual environment: with any other python it creates (once) and re-executes in
$KILN_CACHE_DIR/onnx-1.23.2 (default /var/cache/kiln as root, ~/.cache/kiln otherwise), holding
PyPI's onnx 1.23.2 and numpy 2.4.6. Writes into a temporary directory beside DIR, then renames
the files into DIR. Exit status 1, with the reason on stderr, on failure.
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile

ONNX = "1.23.2"
NUMPY = "2.4.6"


def ensure_venv():
    """Re-executes this script under its pinned venv unless already there (pinned_venv.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pinned_venv
    pinned_venv.reexec("gen-onnx-large", f"onnx-{ONNX}", {"onnx": ONNX, "numpy": NUMPY}, __file__)


def shape_for(size_bytes):
    """(d, blocks, bytes): the narrowest width, a multiple of 256, whose block count for the size
    stays at most d/64."""
    for d in range(256, 32768 + 1, 256):
        per_block = (d * d + d) * 4
        blocks = max(1, round(size_bytes / per_block))
        if blocks <= max(2, d // 64):
            return d, blocks, blocks * per_block
    sys.exit("gen-onnx-large: size too large for widths up to 32768")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def write_fixture(path, tensors, meta):
    """A safetensors file as kiln's FixtureFile::to_bytes lays it out: one metadata key,
    `kiln.fixture`, whose value is a JSON map with sorted keys; tensors (name -> f32 array)
    back to back in name order, the header padded with spaces to a multiple of 8."""
    header = {"__metadata__": {"kiln.fixture": json.dumps(meta, sort_keys=True, separators=(",", ":"))}}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        a = tensors[name]
        data = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


SPEC = """\
# Written by scripts/gen/onnx-large.py: {blocks} blocks of MatMul+Add+Relu, d={d}, seed {seed};
# weights in ONNX external data ({data}, {data_size} bytes).
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata:
  name: {name}
spec:
  source:
    uri: file://{model}
    sha256: {model_sha}
    size: {model_size}
  format: onnx
  formatVersion: "17"
  inputs:
    - name: "x"
      dtype: f32
      dims:
        - {{symbol: batch, min: 1, max: 8}}
        - {{size: {d}}}
  outputs:
    - name: "y"   # quoted: YAML 1.1 reads a bare y as true
      dtype: f32
      dims:
        - {{symbol: batch, min: 1, max: 8}}
        - {{size: {d}}}
  assets:
    - name: {data}
      kind: other
      uri: file://{data}
      sha256: {data_sha}
      size: {data_size}
  fixtures:
    - version: v1
      uri: file://{fixture}
      sha256: {fixture_sha}
  license: Apache-2.0
  provenance:
    producer: scripts/gen/onnx-large.py --size-gb {size_gb:g} --seed {seed}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata:
  name: {name}-{backend}
spec:
  modelRef:
    name: {name}
  backend:
    kind: {backend}
  precision: fp32
  profiles:
    - name: batch{batch}
      dims: {{batch: {batch}}}
  warmup:
    iterations: 3
    fixtureVersion: v1
    defaultTolerance: {{atol: 1.0e-3, rtol: 1.0e-3}}
  fallback:
    policy: FailClosed
"""


def main():
    ensure_venv()
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, required=True, help="about this many GB (1e9 bytes) of weights")
    ap.add_argument("--out", required=True, help="the model file; its data file is OUT.data beside it")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2, help="the fixture's batch (1..8)")
    ap.add_argument("--fixture", help="default: OUT.fixture-v1.safetensors")
    ap.add_argument("--spec", help="also write a kiln-agent local YAML here (beside OUT)")
    ap.add_argument("--backend", choices=["tract", "onnxruntime"], default="tract")
    a = ap.parse_args()
    if not 1 <= a.batch <= 8:
        sys.exit("gen-onnx-large: --batch must be 1..8")

    out = os.path.abspath(a.out)
    out_dir = os.path.dirname(out)
    base = os.path.basename(out)
    data_name = base + ".data"
    fixture = os.path.abspath(a.fixture or out + ".fixture-v1.safetensors")
    d, blocks, est = shape_for(a.size_gb * 1e9)
    print(f"gen-onnx-large: d {d}, {blocks} blocks, about {est / 1e9:.3f} GB -> {out} (+ {data_name})",
          file=sys.stderr)

    rng = np.random.Generator(np.random.PCG64(a.seed))
    x = rng.standard_normal((a.batch, d), dtype=np.float32)
    h = x.astype(np.float64)
    inits, nodes = [], []
    prev = "x"
    for i in range(blocks):
        w = rng.standard_normal((d, d), dtype=np.float32)
        w *= np.float32(np.sqrt(2.0 / d))
        b = rng.standard_normal(d, dtype=np.float32)
        b *= np.float32(0.01)
        h = np.maximum(h @ w.astype(np.float64) + b.astype(np.float64), 0.0)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        inits.append(numpy_helper.from_array(b, f"b{i}"))
        del w
        y = "y" if i == blocks - 1 else f"h{i}"
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"add{i}"], [y], name=f"relu{i}"),
        ]
        prev = y
    rms = float(np.sqrt(np.mean(h * h)))
    print(f"gen-onnx-large: golden output RMS {rms:.4f}, max {float(np.abs(h).max()):.4f}", file=sys.stderr)
    if not 0.05 <= rms <= 20:
        sys.exit(f"gen-onnx-large: activations drifted (RMS {rms}); pick another --seed")

    graph = helper.make_graph(
        nodes, "kiln-onnx-large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="kiln scripts/gen/onnx-large.py")
    model.doc_string = f"seeded MatMul+Add+Relu stack: d={d}, blocks={blocks}, seed={a.seed}"
    del inits, graph

    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen-onnx-large-", dir=out_dir)
    try:
        onnx.save_model(model, os.path.join(tmp, base), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data_name, size_threshold=0)
        del model
        # The graph alone must be a valid model that refers to the data file.
        onnx.checker.check_model(os.path.join(tmp, base))
        for name in (data_name, base):
            os.chmod(os.path.join(tmp, name), 0o644)  # (a temp directory's files are 0600)
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    model_sha = sha256_of(out)
    meta = {"kiln.fixture.version": "v1", "kiln.fixture.model_sha256": model_sha,
            "kiln.fixture.atol": "0.001", "kiln.fixture.rtol": "0.001",
            "kiln.fixture.producer": "scripts/gen/onnx-large.py (numpy float64 reference)"}
    write_fixture(fixture + ".tmp", {"input/x": x, "output/y": h.astype(np.float32)}, meta)
    os.replace(fixture + ".tmp", fixture)
    data_path = os.path.join(out_dir, data_name)
    print(f"gen-onnx-large: wrote {out} ({os.path.getsize(out)} bytes), {data_path} "
          f"({os.path.getsize(data_path)} bytes), {fixture}", file=sys.stderr)

    if a.spec:
        spec = os.path.abspath(a.spec)
        rel = lambda p: os.path.relpath(p, os.path.dirname(spec))
        name = f"onnx-large-{a.size_gb:g}gb".replace(".", "-")
        text = SPEC.format(blocks=blocks, d=d, seed=a.seed, data=data_name, name=name,
                           data_size=os.path.getsize(data_path), model=rel(out),
                           model_sha=model_sha, model_size=os.path.getsize(out),
                           data_sha=sha256_of(data_path), fixture=rel(fixture),
                           fixture_sha=sha256_of(fixture), size_gb=a.size_gb,
                           backend=a.backend, batch=a.batch)
        if rel(data_path) != data_name:
            sys.exit("gen-onnx-large: --spec must be in the model's directory (the asset's uri "
                     "is its name)")
        with open(spec, "w") as f:
            f.write(text)
        print(f"gen-onnx-large: wrote {spec} (backend {a.backend})", file=sys.stderr)


if __name__ == "__main__":
    main()
