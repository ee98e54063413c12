#!/usr/bin/env python3
"""Exports Google's Magika content-type model to StableHLO with JAX: the real example of an MLIR
source (`format: stablehlo`) that kiln.yaml beside this file compiles with IREE.

Source of the weights: the PyPI wheel `magika==1.0.3` (Apache-2.0, Google LLC), member
`magika/models/standard_v3_3/model.onnx` (3.16 MB, tf2onnx 1.16.1, opset 15), which
scripts/ensure/models.sh fetches, checks against its pin and caches as magika.onnx. Its graph
(itself made by jax2tf from a Flax model) is written out below in jax.numpy, its weights read
from the ONNX initializers with `onnx`, and exported with `jax.export`, as a JAX user ships a
model:

  int32[1, 2048] bytes (0..255, 256 = padding)
  -> one_hot(257) @ Dense(257->64) -> GELU(tanh) -> reshape [1, 512, 256] -> LayerNorm (axis 1)
  -> Conv1D(256 -> 512, k=5, VALID) -> GELU(tanh) -> max over length -> LayerNorm(512)
  -> Dense(512 -> 214) -> softmax                                  => float32[1, 214]

Writes model.mlirbc (the StableHLO portable artifact, `exported.mlir_module_serialized`, the
form JAX serialises) and with --text also model.mlir (StableHLO text, `mlir_module()`). The batch
is static: IREE 3.13 refuses JAX's symbolic batch (stablehlo.dynamic_broadcast_in_dim "failed to
legalize"). Source locations are stripped, so the bytes depend only on the pinned versions
(scripts/ensure/jax.sh: jax 0.10.2, onnx 1.23.2, numpy 2.4.6), not on where this file is.

  $(scripts/ensure/jax.sh)/python examples/magika-stablehlo/make.py \\
      --onnx "$(scripts/ensure/models.sh)/magika.onnx" --out examples/magika-stablehlo [--text]
"""
import argparse
import importlib.metadata as md
import os
import sys

import jax
import jax.numpy as jnp
import onnx
from onnx import numpy_helper

P = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/"
NAMES = dict(  # the ONNX initializers holding each weight
    w0="jax2tf_get_logits_/Const:0", b0=P + "Dense_0/Reshape:0",
    ln0_s=P + "LayerNorm_0/Reshape_2:0", ln0_b=P + "LayerNorm_0/Reshape_3:0",
    conv_w=P + "Conv_0/transpose_3:0", conv_b="const_fold_opt__209",
    ln1_s=P + "LayerNorm_1/Reshape_2:0", ln1_b=P + "LayerNorm_1/Reshape_3:0",
    w1="jax2tf_get_logits_/Const_24:0", b1=P + "Dense_1/Reshape:0")


def load_weights(path):
    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    missing = [v for v in NAMES.values() if v not in init]
    if missing:
        sys.exit(f"{path} is not Magika standard_v3_3: no initializer {missing}")
    return {k: jnp.asarray(init[v]) for k, v in NAMES.items()}


def gelu_tanh(x):  # the graph's constants: 0.044715, sqrt(2/pi), 0.5
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845834732056 * (x + 0.044715 * x * x * x)))


def layer_norm(x, scale, bias, axis):  # E[x^2] - E[x]^2, eps 1e-6, as the graph computes it
    mean = jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.maximum(jnp.mean(x * x, axis=axis, keepdims=True) - mean * mean, 0.0)
    return (x - mean) * (jax.lax.rsqrt(var + 1e-6) * scale) + bias


def magika(w, tokens):
    x = jax.nn.one_hot(tokens, 257, dtype=jnp.float32)
    x = gelu_tanh(x @ w["w0"] + w["b0"])
    x = x.reshape(x.shape[0], 512, 256)
    x = layer_norm(x, w["ln0_s"], w["ln0_b"], axis=1)
    x = jnp.swapaxes(x, 1, 2)
    x = jax.lax.conv_general_dilated(x, w["conv_w"][..., 0], (1,), "VALID",
                                     dimension_numbers=("NCH", "OIH", "NCH"))
    x = gelu_tanh(x + w["conv_b"])
    x = jnp.max(x, axis=2)
    x = layer_norm(x, w["ln1_s"], w["ln1_b"], axis=1)
    return jax.nn.softmax(x @ w["w1"] + w["b1"], axis=-1)


def without_locations(text):
    """The module without the source locations JAX records (this file's path and lines, which
    would make the bytes depend on where the checkout is), as text and as the portable artifact
    JAX itself serialises (`mlir_module_serialized`, through jax 0.10.2's own helper)."""
    from jax._src.export._export import _module_to_bytecode
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir, passmanager
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(module.operation)
        return str(module), _module_to_bytecode(module)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--onnx", required=True, help="magika.onnx (scripts/ensure/models.sh)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", action="store_true", help="also write model.mlir")
    a = ap.parse_args()
    print(" ".join(f"{p}=={md.version(p)}" for p in ("jax", "jaxlib", "onnx", "numpy")))
    w = load_weights(a.onnx)
    exported = jax.export.export(jax.jit(lambda t: magika(w, t)), platforms=["cpu"])(
        jax.ShapeDtypeStruct((1, 2048), jnp.int32))
    text, bytecode = without_locations(exported.mlir_module())
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.mlirbc"), "wb") as f:
        f.write(bytecode)
    if a.text:
        with open(os.path.join(a.out, "model.mlir"), "w") as f:
            f.write(text)
    print("wrote", a.out, "in:", exported.in_avals, "out:", exported.out_avals)


if __name__ == "__main__":
    main()
