#!/usr/bin/env python3
"""Regenerates the small ONNX models the kiln-agent tests use (committed; CI does not run this).

* mlp.onnx — Gemm(16→32) → Relu → Gemm(32→10) → Softmax, seeded random weights, symbolic batch,
  and a metadata string with a single quote (tract's NNEF writer cannot reload those).
* mlp-drift.onnx — mlp.onnx with one output bias moved by 1.0 (same interface, other numbers).
* two-outputs.onnx — y = Sqrt(x) (NaN for the negative inputs of a seeded fixture) and
  abs = Abs(x), symbolic batch: the non-finite golden and unchecked-output paths of parity.
* unsupported.onnx — one standard ONNX operator tract does not implement (for the
  UnsupportedOperator path).
* oob-gather.onnx — a Gather indexing past its input (tract's reference execution panics).
* huge.onnx — 212 bytes that ask for a 40 GB tensor (ConstantOfShape [100000, 100000] f32).
* ext.onnx + ext-weights.bin, ext-sneaky.onnx — weights as ONNX external data; the sneaky copy
  names the weights' blob in a shared blob cache by its sha256.
* detector.onnx — a YOLOv8-style stem: Conv stride 2 → SiLU → Conv stride 2 on
  images[batch, 3, height, width], with the exporter's value_info and output shapes in terms of
  those symbols (`batch,16,(height+1)/2,(width+1)/2`), which no concrete profile unifies with.
* if-shape.onnx — y = Relu(x) if x has one row else Neg(x): an `If` whose condition is computed
  from a shape only, so a profile decides it at compile time.

Usage: pip install onnx==1.23.2 numpy && python3 node-agent/tests/data/make_models.py
"""
import os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261121)

w1 = numpy_helper.from_array(rng.normal(0, 0.5, (32, 16)).astype(np.float32), "w1")
b1 = numpy_helper.from_array(rng.normal(0, 0.1, (32,)).astype(np.float32), "b1")
w2 = numpy_helper.from_array(rng.normal(0, 0.5, (10, 32)).astype(np.float32), "w2")
b2 = numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32), "b2")
graph = helper.make_graph(
    [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ],
    "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
    [w1, b1, w2, b2],
)
mlp = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-tests")
helper.set_model_props(mlp, {"note": "it's a test model"})
onnx.checker.check_model(mlp)
onnx.save(mlp, os.path.join(here, "mlp.onnx"))

# mlp-drift.onnx: the same graph with one output bias moved by 1.0, what a broken converter
# could emit (same inputs and outputs, different numbers): the exec backend's ParityExceeded case.
drift = onnx.ModelProto()
drift.CopyFrom(mlp)
b2_drift = numpy_helper.to_array(b2).copy()
b2_drift[0] += 1.0
for i, init in enumerate(drift.graph.initializer):
    if init.name == "b2":
        drift.graph.initializer[i].CopyFrom(numpy_helper.from_array(b2_drift, "b2"))
onnx.checker.check_model(drift)
onnx.save(drift, os.path.join(here, "mlp-drift.onnx"))

graph = helper.make_graph(
    [helper.make_node("Sqrt", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["abs"])],
    "two_outputs",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
    [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16]),
        helper.make_tensor_value_info("abs", TensorProto.FLOAT, ["batch", 16]),
    ],
)
two = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-tests")
onnx.checker.check_model(two)
onnx.save(two, os.path.join(here, "two-outputs.onnx"))

graph = helper.make_graph(
    [helper.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"])],
    "unsupported",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
    [
        numpy_helper.from_array(np.array([4, 4], dtype=np.int64), "image_shape"),
        numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "block_shape"),
    ],
)
unsupported = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="kiln-tests")
onnx.checker.check_model(unsupported)
onnx.save(unsupported, os.path.join(here, "unsupported.onnx"))
print("wrote mlp.onnx, mlp-drift.onnx, two-outputs.onnx and unsupported.onnx with onnx", onnx.__version__)

# oob-gather.onnx — a 200-byte hostile model: Gather with a constant index far past axis 1 of
# x[batch, 16]. tract 0.23.9 panics on it at run time (index out of bounds), which kiln must
# contain as a classified failure.
idx = numpy_helper.from_array(np.array([100], dtype=np.int64), "idx")
oob = helper.make_model(
    helper.make_graph(
        [helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)],
        "oob",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [idx],
    ),
    opset_imports=[helper.make_opsetid("", 13)],
    producer_name="kiln-tests",
)
onnx.save(oob, os.path.join(here, "oob-gather.onnx"))

# ext.onnx + ext-weights.bin — y = x @ w with w[16, 4] stored as ONNX external data in
# ext-weights.bin (declared as an asset of that name). ext-sneaky.onnx is the same graph whose
# external data location is the sha256 of ext-weights.bin: the file name that blob has in a
# store's shared blob cache, where a model must not reach.
import hashlib
import shutil
import tempfile
w = numpy_helper.from_array(np.random.default_rng(7).normal(0, 0.5, (16, 4)).astype(np.float32), "w")
ext = helper.make_model(
    helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w],
    ),
    opset_imports=[helper.make_opsetid("", 13)],
    producer_name="kiln-tests",
)
tmp = tempfile.mkdtemp()
onnx.save_model(ext, os.path.join(tmp, "ext.onnx"), save_as_external_data=True,
                all_tensors_to_one_file=True, location="ext-weights.bin", size_threshold=0)
shutil.copy(os.path.join(tmp, "ext.onnx"), os.path.join(here, "ext.onnx"))
shutil.copy(os.path.join(tmp, "ext-weights.bin"), os.path.join(here, "ext-weights.bin"))
weights_sha = hashlib.sha256(open(os.path.join(here, "ext-weights.bin"), "rb").read()).hexdigest()
sneaky = onnx.load(os.path.join(tmp, "ext.onnx"), load_external_data=False)
for init in sneaky.graph.initializer:
    for entry in init.external_data:
        if entry.key == "location":
            entry.value = weights_sha
onnx.save_model(sneaky, os.path.join(here, "ext-sneaky.onnx"))

# huge.onnx — y = x + ReduceSum(ConstantOfShape([100000, 100000], 1.0)): a 212-byte model whose
# constant is 40 GB of f32. With overcommit the allocation succeeds and filling it exhausts the
# machine; kiln's heap ceiling must refuse it.
huge = helper.make_model(
    helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"],
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
            helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
            helper.make_node("Add", ["x", "s"], ["y"]),
        ],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array([100000, 100000], dtype=np.int64), "shape")],
    ),
    opset_imports=[helper.make_opsetid("", 13)],
)
huge.ir_version = 8
onnx.save(huge, os.path.join(here, "huge.onnx"))

# detector.onnx — see the docstring. Opset 17, IR version 10 (ONNX Runtime 1.31 reads up to 13).
def conv(name, cin, cout):
    w = rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, (cout,)).astype(np.float32)
    return [numpy_helper.from_array(w, name + ".w"), numpy_helper.from_array(b, name + ".b")]


def stride2(name, x, y):
    return helper.make_node("Conv", [x, name + ".w", name + ".b"], [y], name=f"/{name}/conv/Conv",
                            kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


half = ["batch", 16, "(height+1)/2", "(width+1)/2"]
quarter = ["batch", 8, "((height+1)/2+1)/2", "((width+1)/2+1)/2"]
detector = helper.make_model(
    helper.make_graph(
        [
            stride2("model.0", "images", "c0"),
            helper.make_node("Sigmoid", ["c0"], ["s0"], name="/model.0/act/Sigmoid"),
            helper.make_node("Mul", ["c0", "s0"], ["a0"], name="/model.0/act/Mul"),
            stride2("model.1", "a0", "output0"),
        ],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, quarter)],
        conv("model.0", 3, 16) + conv("model.1", 16, 8),
        value_info=[helper.make_tensor_value_info(n, TensorProto.FLOAT, half) for n in ["c0", "s0", "a0"]],
    ),
    opset_imports=[helper.make_opsetid("", 17)],
    producer_name="kiln-tests",
)
detector.ir_version = 10
onnx.checker.check_model(detector, full_check=True)
onnx.save(detector, os.path.join(here, "detector.onnx"))

# if-shape.onnx — see the docstring.
branch = lambda op, out: helper.make_graph(
    [helper.make_node(op, ["x"], [out])], op.lower(), [],
    [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])
if_shape = helper.make_model(
    helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
            helper.make_node("Equal", ["rows", "one"], ["single"]),
            helper.make_node("If", ["single"], ["y"], name="one_row",
                             then_branch=branch("Relu", "t"), else_branch=branch("Neg", "e")),
        ],
        "if_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one")],
    ),
    opset_imports=[helper.make_opsetid("", 17)],
    producer_name="kiln-tests",
)
if_shape.ir_version = 10
onnx.checker.check_model(if_shape, full_check=True)
onnx.save(if_shape, os.path.join(here, "if-shape.onnx"))
print("wrote detector.onnx and if-shape.onnx")
