#!/usr/bin/env bash
# The last mile on a third-party Open Inference Protocol v2 server, on the real cluster: KServe's
# own ModelServer (`kserve` 0.21.0 from PyPI) wrapping ONNX Runtime 1.31.1 (PyPI) reads the
# verified artifact of an onnxruntime target from the csi.kiln.dev volume
# (e2e/testdata/kserve_onnx.py: the optimised graph from kiln's artifact tar, nothing else of
# kiln's), in an image of Debian's Python and that environment (scripts/ensure/kserve.sh), in a
# namespace enforcing Pod Security "restricted". Asserts: the pod is never Ready before the node's
# row is Ready and the agent has checked its server (KServe lists no binary tensor extension, so
# the agent's requests are JSON tensors); a real v2 client (tritonclient[http]) gets the
# fixture's golden outputs through the Service within tolerance; the same server asked for a
# model it does not serve stays not Ready with ServingMismatch.
#
# Needs PyPI once (the server's and the client's environments; required under CI).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test serving-kserve
TARGET=squeezenet-ort
NETNS=kiln-e2e

needs() {
  [[ ${CI:-} != true ]] || die "$1 is required under CI=true"
  skip "$1: it needs PyPI once"
}
PY=$("$REPO/scripts/ensure/v2-client.sh") || needs "the v2 client (scripts/ensure/v2-client.sh)"
KSERVE=$("$REPO/scripts/ensure/kserve.sh") || needs "KServe (scripts/ensure/kserve.sh)"
kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_images "$WORK/images" || die "images"
IMAGE=e2e/kserve-onnx:0.21.0
# The image is reproducible: kept in the e2e cache under a key of what goes into it (the
# wrapper, the recipe, the interpreter, the environment's creation), built only when missing.
key=$({ cat "$REPO/e2e/testdata/kserve_onnx.py" "$REPO/scripts/ensure/kserve.sh" "$REPO/scripts/lib.sh" "$E2E_DIR/build-image" /usr/bin/python3.11
  stat -c %Y "$KSERVE/pyvenv.cfg"; } | sha256sum | cut -c1-12)
TAR=$CACHE/images/kserve-onnx-0.21.0-$key.tar
if [[ ! -s $TAR ]]; then
  mkdir -p "$CACHE/images"
  rm -f "$CACHE"/images/kserve-onnx-*.tar
  "$E2E_DIR/build-image" --name "$IMAGE" --out "$TAR.tmp" --path /usr/bin/python3.11 \
    --symlink usr/bin/python3:python3.11 --add-tree /usr/lib/python3.11 --add-tree "$KSERVE" \
    --add "$REPO/e2e/testdata/kserve_onnx.py:/app/kserve_onnx.py" --env PYTHONDONTWRITEBYTECODE=1 \
    --entrypoint "$KSERVE/bin/python" --entrypoint /app/kserve_onnx.py /usr/bin/python3.11 >/dev/null &&
    mv "$TAR.tmp" "$TAR" || die "the KServe image"
fi
"$E2E_DIR/cluster" load-image "$TAR" >/dev/null || die "load the KServe image"
T0=$(date +%s.%N)
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"

echo "== the example on onnxruntime; the compile Job runs before the namespace is restricted"
{
  awk '/^kind: CompiledTarget/{exit} {print}' "$REPO/examples/squeezenet/kiln.yaml" | sed '$d'
  printf -- '---\n'
  sed -e "s/name: squeezenet-cpu/name: $TARGET/" -e 's/kind: tract/kind: onnxruntime/' \
    <(awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' "$REPO/examples/squeezenet/kiln.yaml")
} | kubectl -n "$NS" apply -f - >/dev/null || die "apply"
wait_for "compile Job done" 300 bash -c \
  "kubectl -n '$NS' get jobs -o json | jq -e '.items | length > 0 and all(.status.succeeded == 1)' >/dev/null"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1

# pod_yaml NAME MODEL-NAME: a KServe pod serving MODEL-NAME on this node with the target's
# volume, as a user writes one, and its Service.
pod_yaml() {
  gated_pod "$1" "$TARGET" "kiln.dev/protocol: oip-v2, kiln.dev/port: \"8080\", kiln.dev/model-name: $TARGET" "$IMAGE" \
    "[--model-dir, /model, --model-name, $2, --http_port, \"8080\", --grpc_port, \"8081\"]" "/v2/models/$2/ready" 8080
  cat <<YAML
---
apiVersion: v1
kind: Service
metadata: {name: $1}
spec:
  selector: {app: $1}
  ports: [{name: http, port: 8080, targetPort: 8080}]
YAML
}
pod_yaml kserve "$TARGET" | kubectl -n "$NS" apply -f - >/dev/null || die "the restricted namespace refused the KServe pod"

echo "== never Ready before the row and the check through KServe"
pod() { kubectl -n "$NS" get pod kserve -o json 2>/dev/null; }
serving_ready pod "$T0"
p=$P message=$MESSAGE
kubectl -n "$NS" logs kserve >"$WORK/kserve.log" 2>&1 || true
grep -m1 'kserve_onnx:' "$WORK/kserve.log" | sed 's/^/   /'

echo "== a real v2 client through the Service"
IP=$(kubectl -n "$NS" get svc kserve -o jsonpath='{.spec.clusterIP}')
check=$(ip netns exec "$NETNS" "$PY" "$REPO/e2e/testdata/v2_check.py" "$IP:8080" "$TARGET" "$WORK/sources/fixture-v1.safetensors" 1e-5 1e-4) ||
  die "tritonclient through the Service: $check"
first_after_ready "$check" '{maxAbsError}'

echo "== KServe serving another model name stays not Ready"
pod_yaml other other | kubectl -n "$NS" apply -f - >/dev/null || die "apply the other pod"
wait_for "another model: ServingMismatch" 180 bash -c \
  "[[ \$(kubectl -n '$NS' get pod other -o jsonpath='{.status.conditions[?(@.type==\"kiln.dev/warm\")].reason}') == ServingMismatch ]]"
[[ $(kubectl -n "$NS" get pod other -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') != True ]] ||
  die "a server that does not serve the target's model is Ready"
echo "   other: $(kubectl -n "$NS" get pod other -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].message}' | cut -c1-200)"
kubectl -n "$NS" delete pod kserve other --wait=false >/dev/null
echo "serving-kserve: a third-party v2 server Ready only after the row and its own check; golden outputs through the Service"
