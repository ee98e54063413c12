#!/usr/bin/env bash
# The OCI store end to end: kiln-operator (a host process with its ServiceAccount's token) runs
# with `--store oci://$REGISTRY_ADDR/<repo>`; the real node's compile Job runs the real
# `kiln-agent compile` from a build-image image and pushes to the cluster's docker-registry over
# the pod network, with no hostPath store. Then, straight from the registry's HTTP API: the
# manifest tagged with the compile key has the digest the target's status records as
# manifestDigest, kiln's media types, and one layer whose digest is the artifact digest in status
# and whose bytes hash to it. The model's source is itself an OCI artifact: a CNCF ModelPack the
# real oras CLI pushed to that registry, named by digest (`oci://…@sha256:…#model.onnx`).
source "$(dirname "$0")/lib.sh"
# Set-up shared with the operator tests (agent image, sources, CRDs, RBAC, kubeconfig); this
# test starts its own operator, on the registry store instead of the hostPath one.
source "$(dirname "$0")/operator-lib.sh"

report_hardware "$REAL"
STORE_REPO="kiln-$NS"
STORE="oci://$REGISTRY_ADDR/$STORE_REPO"
KUBECONFIG=$WORK/kubeconfig "$OPERATOR" --store "$STORE" --registry-insecure \
  --agent-image kiln-e2e/agent:test --agent-image-pull-policy Never \
  --sources-host-path "$WORK/sources" --listen 127.0.0.1:18091 --no-leader-election \
  --retry-backoff-seconds 2 >>"$WORK/operator-oci.log" 2>&1 &
OP_PIDS+=($!)
wait_for "operator /readyz" 60 curl -fsS http://127.0.0.1:18091/readyz

echo "== the model as a CNCF ModelPack pushed by oras to the registry; the source names it by digest"
oras=$("$REPO/scripts/ensure/oras.sh") || die "oras could not be built (scripts/ensure/oras.sh)"
pack=$WORK/modelpack
mkdir -p "$pack"
cp "$REPO/examples/squeezenet/model.onnx" "$pack/"
echo '{"descriptor":{"name":"squeezenet"},"config":{"format":"onnx"},"modelfs":{"type":"layers","diffIds":[]}}' >"$pack/config.json"
echo '{"model.onnx":{"org.cncf.model.filepath":"model.onnx"}}' >"$pack/annotations.json"
PACK_REF=$REGISTRY_ADDR/models-$NS/squeezenet
(cd "$pack" && "$oras" push --plain-http --artifact-type application/vnd.cncf.model.manifest.v1+json \
  --config config.json:application/vnd.cncf.model.config.v1+json --annotation-file annotations.json \
  "$PACK_REF:v1" model.onnx:application/vnd.cncf.model.weight.v1.raw >"$WORK/oras.log" 2>&1) ||
  die "oras push: $(cat "$WORK/oras.log")"
PACK=$("$oras" resolve --plain-http "$PACK_REF:v1") || die "oras resolve $PACK_REF:v1"
SOURCE="oci://$PACK_REF@$PACK#model.onnx"
echo "   $SOURCE"

echo "== the compile Job pulls it from the registry and pushes to $STORE; the target records revision 1 with the manifest digest"
sed "s|uri: file://model.onnx|uri: $SOURCE|" "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null
[[ $(kubectl -n "$NS" get modelartifact squeezenet -o jsonpath='{.spec.source.uri}') == "$SOURCE" ]] ||
  die "the ModelArtifact does not name the oci:// source"
compiled() {
  local s
  s=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')
  [[ $s != True ]] || die "Stalled: $(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o jsonpath='{.status.conditions[?(@.type=="Stalled")].message}')"
  [[ -n $(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o jsonpath='{.status.revisions[0].artifacts[0].manifestDigest}') ]]
}
wait_for "squeezenet-cpu revision 1" 240 compiled
status=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json)
KEY=$(jq -r '.status.classes[0].compileKey' <<<"$status")
DIGEST=$(jq -r '.status.classes[0].artifactDigest' <<<"$status")
MDIGEST=$(jq -r '.status.classes[0].manifestDigest' <<<"$status")
[[ $MDIGEST == sha256:* ]] || die "no manifestDigest in status: $MDIGEST"
[[ $(jq -r '.status.revisions[-1].artifacts[0].manifestDigest' <<<"$status") == "$MDIGEST" ]] ||
  die "revision does not record the manifest digest"
job=$(kubectl -n "$NS" get jobs -o json | jq -r '.items[0]')
jq -e --arg s "$STORE" '.spec.template.spec.containers[0].env[] | select(.name == "KILN_STORE") | .value == $s' <<<"$job" >/dev/null ||
  die "the Job's KILN_STORE is not $STORE"
jq -e '[.spec.template.spec.volumes[] | select(.hostPath != null and .name == "store")] | length == 0' <<<"$job" >/dev/null ||
  die "a registry store must not mount a hostPath store"
echo "   key $KEY -> manifest $MDIGEST, artifact sha256:$DIGEST"

echo "== the registry holds exactly that, by tag and by digest"
api=http://$REGISTRY_ADDR/v2/$STORE_REPO
accept='Accept: application/vnd.oci.image.manifest.v1+json'
curl -fsS -H "$accept" "$api/manifests/$KEY" >"$WORK/manifest.json" || die "no manifest tagged $KEY"
[[ sha256:$(sha256sum <"$WORK/manifest.json" | cut -d' ' -f1) == "$MDIGEST" ]] || die "tag $KEY is not manifest $MDIGEST"
curl -fsS -H "$accept" "$api/manifests/$MDIGEST" | cmp -s - "$WORK/manifest.json" || die "manifest by digest differs"
jq -e --arg d "sha256:$DIGEST" '.artifactType == "application/vnd.kiln.artifact.v1"
  and .config.mediaType == "application/vnd.kiln.build-manifest.v1+json"
  and (.layers | length) == 1 and .layers[0].mediaType == "application/vnd.kiln.engine.v1.tar"
  and .layers[0].digest == $d' "$WORK/manifest.json" >/dev/null || die "layout: $(cat "$WORK/manifest.json")"
[[ $(curl -fsS "$api/blobs/sha256:$DIGEST" | sha256sum | cut -d' ' -f1) == "$DIGEST" ]] || die "layer bytes do not hash to $DIGEST"
config=$(jq -r .config.digest "$WORK/manifest.json")
curl -fsS "$api/blobs/$config" | jq -e --arg k "$KEY" --arg d "$DIGEST" '.compileKey == $k and .artifactDigest == $d and .backend == "tract"' >/dev/null ||
  die "build manifest in the config blob disagrees"
[[ -f $REGISTRY_DIR/docker/registry/v2/blobs/sha256/${DIGEST:0:2}/$DIGEST/data ]] || die "blob not under $REGISTRY_DIR"
[[ $(curl -fsS "$api/tags/list" | jq -c .tags) == "[\"$KEY\"]" ]] || die "tags: $(curl -fsS "$api/tags/list")"
echo "store-oci e2e passed"
