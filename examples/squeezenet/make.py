#!/usr/bin/env python3
"""Regenerates examples/squeezenet/model.onnx from the ONNX project's backend test data.

Source: the `onnx` Python wheel (Apache-2.0), onnx/backend/test/data/light/light_squeezenet.onnx,
a SqueezeNet 1.0 graph (Caffe2 export, opset 9) whose weights the ONNX project replaced by
ConstantOfShape nodes to keep the file small. The only change made here: the batch dimension of
the input and output becomes the symbolic dim `batch`, so shape profiles can bind it.

Usage: pip install onnx==1.23.2 && python3 examples/squeezenet/make.py
"""
import os
import onnx

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_squeezenet.onnx")
model = onnx.load(src)
initializers = {i.name for i in model.graph.initializer}
for value in list(model.graph.input) + list(model.graph.output):
    if value.name in initializers:
        continue
    dim = value.type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
onnx.checker.check_model(model)
onnx.save(model, os.path.join(here, "model.onnx"))
print("onnx", onnx.__version__, "->", os.path.join(here, "model.onnx"))
