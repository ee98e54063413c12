"""A third-party Open Inference Protocol v2 server for kiln's serving e2e test: KServe's own
ModelServer (the `kserve` package from PyPI: its FastAPI REST server, v2 routes, metadata and
JSON tensors) wrapping ONNX Runtime (`onnxruntime` from PyPI; `onnx` reads the graph) on the artifact of a
`csi.kiln.dev` volume. kiln's ONNX Runtime artifact is a tar holding the optimised graph
(`model.onnx`) and the session configuration; the graph is read from it by name, never
extracted. A plain ONNX file is taken as it is. The model's inputs and outputs, for the v2
metadata, come from the ONNX Runtime session.

    python3 kserve_onnx.py --model-dir /model --model-name NAME [--http_port 8080]
"""
import argparse
import json
import os
import tarfile

import kserve
import numpy as np
import onnx
import onnxruntime as ort
from kserve import InferOutput, InferResponse, Model, ModelServer
from importlib.metadata import version

DATATYPES = {"tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
             "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(int8)": "INT8",
             "tensor(uint8)": "UINT8", "tensor(bool)": "BOOL"}


def graph_bytes(path):
    """The ONNX graph of kiln's artifact: the tar's model.onnx, or the file itself."""
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            return tar.extractfile("model.onnx").read()
    with open(path, "rb") as f:
        return f.read()


def without_dangling_inputs(graph):
    """The graph without declared inputs that no node reads. A model of ONNX IR 3 lists its
    initializers as graph inputs; ONNX Runtime's optimiser folds some away (the example's Reshape
    shapes) and saves their inputs still declared, read by nothing. ONNX Runtime's C API (kiln's
    engine) runs without them; its Python binding, like Triton's model configuration, calls every
    declared input required."""
    model = onnx.load_from_string(graph)
    read = {name for node in model.graph.node for name in node.input}
    read |= {o.name for o in model.graph.output}
    keep = [i for i in model.graph.input if i.name in read]
    if len(keep) == len(model.graph.input):
        return graph
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model.SerializeToString()


class OnnxModel(Model):
    def __init__(self, name, model_dir):
        super().__init__(name)
        self.model_dir = model_dir
        self.session = None

    def load(self):
        info = json.load(open(os.path.join(self.model_dir, "kiln.json")))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        # kiln optimised the graph at compile: opened as saved, as kiln's engine opens it.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        graph = without_dangling_inputs(graph_bytes(os.path.join(self.model_dir, "artifact")))
        self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        print(f"kserve_onnx: {info['namespace']}/{info['target']} revision {info['revision']} "
              f"digest {info['digest']}, onnxruntime {ort.__version__}, kserve {version('kserve')}",
              flush=True)
        self.ready = True
        return self.ready

    def _types(self, args):
        return [{"name": a.name, "datatype": DATATYPES.get(a.type, a.type),
                 "shape": [d if isinstance(d, int) else -1 for d in a.shape]} for a in args]

    def get_input_types(self):
        return self._types(self.session.get_inputs())

    def get_output_types(self):
        return self._types(self.session.get_outputs())

    async def predict(self, payload, headers=None, response_headers=None):
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        names = [o.name for o in self.session.get_outputs()]
        values = self.session.run(names, feeds)
        outputs = []
        for name, value in zip(names, values):
            value = np.ascontiguousarray(value)
            out = InferOutput(name=name, shape=list(value.shape),
                              datatype=DATATYPES[f"tensor({ort_type(value)})"])
            out.set_data_from_numpy(value, binary_data=False)
            outputs.append(out)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs)


def ort_type(value):
    return {np.float32: "float", np.float64: "double", np.float16: "float16", np.int64: "int64",
            np.int32: "int32", np.int8: "int8", np.uint8: "uint8", np.bool_: "bool"}[value.dtype.type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-name", required=True)
    args, _ = parser.parse_known_args()
    model = OnnxModel(args.model_name, args.model_dir)
    model.load()
    ModelServer(workers=1).start([model])
