#!/usr/bin/env python3
"""Regenerates the ONNX Runtime backend's test models (committed; CI does not run this).

Models with their given inputs as safetensors (`kiln-agent fixtures --inputs`); the golden
outputs are made by the tests with `kiln-agent fixtures --reference onnxruntime`. Most are models
tract cannot compile (control flow whose branches or loop bodies it cannot type); one is a model
tract compiles and ONNX Runtime is the reference for.

* loop11.onnx, range-loop.onnx, if.onnx — the ONNX backend test cases `test_loop11`,
  `test_range_float_type_positive_delta_expanded` (restamped opset 11, see below) and `test_if`,
  exported from the case definitions shipped in the PyPI `onnx` 1.23.2 wheel (Apache-2.0,
  LICENSE.onnx), with the inputs of their first data set. Scalar, bool and int64 inputs.
* silero-vad.onnx — Silero VAD v6 (`silero_vad/data/silero_vad.onnx` of the PyPI `silero-vad`
  6.2.3 wheel, sha256 7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8; MIT,
  LICENSE.silero-vad): a real voice-activity model whose graph is an `If` on the sample rate.
  Inputs: 512 samples of a seeded voiced-like signal, a zero state, sr = 16000.
* encoder.onnx — a BERT-style encoder block on x[batch, sequence, 32]: self-attention (ONNX
  `Attention`, opset 23, 4 heads, queries through a MatMul), MatMul + bias, the exact GELU
  `0.5·h·(1+erf(h/√2))` as exporters write it (Div, Erf, Add, Mul, Mul) and LayerNormalization;
  seeded weights. tract fuses the attention into `Sdpa` and the GELU into `GeluExact`. Inputs:
  x[2, 8, 32], seeded.

Usage:
  pip install onnx==1.23.2 numpy
  pip download --no-deps silero-vad==6.2.3 && unzip -j silero_vad-6.2.3-*.whl \
      silero_vad/data/silero_vad.onnx && mv silero_vad.onnx silero-vad.onnx
  python3 node-agent/tests/data/ort/make.py
"""
import json
import os
import struct

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.case import node as cases

here = os.path.dirname(os.path.abspath(__file__))
DTYPES = {np.float32: "F32", np.float64: "F64", np.int64: "I64", np.int32: "I32", np.bool_: "BOOL"}


def write_safetensors(path, tensors):
    header, blobs = {}, b""
    for name, a in tensors.items():
        a = np.asarray(a).copy(order="C")  # ascontiguousarray would make scalars 1-d
        b = a.tobytes()
        header[name] = {
            "dtype": DTYPES[a.dtype.type],
            "shape": list(a.shape),
            "data_offsets": [len(blobs), len(blobs) + len(b)],
        }
        blobs += b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blobs)


by_name = {c.name: c for c in cases.collect_testcases(None)}
for name, short in [
    ("test_loop11", "loop11"),
    ("test_range_float_type_positive_delta_expanded", "range-loop"),
    ("test_if", "if"),
]:
    case = by_name[name]
    model = case.model
    if short == "range-loop":
        # Stamped with the in-development opset 27, which ONNX Runtime 1.31 refuses; every
        # operator of the expansion (Loop, Cast, Sub, Div, Ceil, Max, Add, Identity) is opset 11.
        model.opset_import[0].version = 11
        onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.path.join(here, short + ".onnx"))
    inputs, _ = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    write_safetensors(
        os.path.join(here, short + "-inputs.safetensors"),
        {n: np.asarray(v) for n, v in zip(names, inputs)},
    )

rng = np.random.default_rng(20261123)
t = np.arange(512) / 16000.0
x = 0.4 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 440 * t)
x = (x + 0.05 * rng.normal(size=512)).astype(np.float32)[None, :]
write_safetensors(
    os.path.join(here, "silero-vad-inputs.safetensors"),
    {"input": x, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)},
)

rng = np.random.default_rng(20261201)
const = lambda name, a: numpy_helper.from_array(np.asarray(a, np.float32), name)
weights = [
    const("wq", rng.normal(0, 0.3, (32, 32))),
    const("w1", rng.normal(0, 0.3, (32, 64))),
    const("b1", rng.normal(0, 0.1, (64,))),
    const("sqrt2", np.sqrt(2.0)),
    const("one", 1.0),
    const("half", 0.5),
    const("gamma", 1 + rng.normal(0, 0.1, (64,))),
    const("beta", rng.normal(0, 0.1, (64,))),
]
op = lambda kind, ins, out, **attrs: helper.make_node(kind, ins, [out], name=f"/layer/{out}", **attrs)
encoder = helper.make_model(
    helper.make_graph(
        [
            op("MatMul", ["x", "wq"], "q"),
            op("Attention", ["q", "x", "x"], "attn", q_num_heads=4, kv_num_heads=4),
            op("MatMul", ["attn", "w1"], "mm"),
            op("Add", ["mm", "b1"], "h"),
            op("Div", ["h", "sqrt2"], "h_scaled"),
            op("Erf", ["h_scaled"], "erf"),
            op("Add", ["erf", "one"], "erf_1"),
            op("Mul", ["h", "erf_1"], "h_erf"),
            op("Mul", ["h_erf", "half"], "gelu"),
            op("LayerNormalization", ["gelu", "gamma", "beta"], "y", axis=-1, epsilon=1e-5),
        ],
        "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 64])],
        weights,
    ),
    opset_imports=[helper.make_opsetid("", 23)],
    producer_name="kiln-tests",
)
encoder.ir_version = 10  # ONNX Runtime 1.31 reads IR versions up to 13
onnx.checker.check_model(encoder, full_check=True)
onnx.save(encoder, os.path.join(here, "encoder.onnx"))
write_safetensors(
    os.path.join(here, "encoder-inputs.safetensors"),
    {"x": rng.normal(0, 1, (2, 8, 32)).astype(np.float32)},
)
