"""A real Open Inference Protocol v2 client (NVIDIA's tritonclient[http], from PyPI) talking to a
server, as a test drives it: checks liveness, readiness and the model's metadata, then sends the
inputs of CASE (a JSON list of v2 tensors) with the binary tensor extension both ways (the
client's default) and prints the outputs as v2 JSON tensors for the test to judge.

    python v2_client.py HOST:PORT MODEL CASE.json [--json]    (--json: no binary extension)
"""
import json
import sys

import numpy as np
import tritonclient.http as http
from tritonclient.utils import InferenceServerException, triton_to_np_dtype


def main():
    url, model, case = sys.argv[1:4]
    binary = "--json" not in sys.argv[4:]
    client = http.InferenceServerClient(url=url, network_timeout=60.0)
    assert client.is_server_live(), "not live"
    assert client.is_server_ready(), "not ready"
    assert client.is_model_ready(model), "model not ready"
    meta = client.get_model_metadata(model)
    inputs = []
    for t in json.load(open(case)):
        arr = np.array(t["data"], dtype=triton_to_np_dtype(t["datatype"])).reshape(t["shape"])
        i = http.InferInput(t["name"], list(arr.shape), t["datatype"])
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    outputs = [http.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]]
    try:
        result = client.infer(model, inputs, outputs=outputs or None)
    except InferenceServerException as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(3)
    got = []
    for o in result.get_response()["outputs"]:
        arr = result.as_numpy(o["name"])
        got.append({"name": o["name"], "shape": list(arr.shape), "datatype": o["datatype"],
                    "data": arr.flatten().tolist()})
    print(json.dumps({"metadata": meta, "outputs": got,
                      "binary": any("binary_data_size" in o.get("parameters", {})
                                    for o in result.get_response()["outputs"])}))


if __name__ == "__main__":
    main()
