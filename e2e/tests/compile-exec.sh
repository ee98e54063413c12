#!/usr/bin/env bash
# A foreign compiler image (backend.kind: exec) on the real cluster (set-up in operator-lib.sh):
# the compiler image is Debian's static busybox (no C library at all), pinned by digest; the
# operator's Job injects kiln-agent with an init container (agent image -> emptyDir, with its own
# loader and libraries), a second init container runs that copy in the busybox image, which
# verifies the source and runs backend.command (sh) with no store, credentials or key; the
# compile container (agent image) builds and parity-checks the handed-over model, stores it and
# signs its provenance, which the operator verifies. A compiler that fails ends Stalled with
# CompileFailed and its own last words in the condition; an image not pinned by digest is
# refused at admission.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/operator-lib.sh"

ensure_busybox
digest=$(tar -xOf "$BUSYBOX_TAR" index.json | jq -r '.manifests[0].digest')
[[ $digest == sha256:* ]] || die "no manifest digest in $BUSYBOX_TAR"
COMPILER="docker.io/$BUSYBOX_IMAGE"
COMPILER="${COMPILER%:*}@$digest"

report_hardware "$REAL"
"$(bin kiln-agent)" keygen "$WORK/keys" >/dev/null || die "keygen"
kubectl -n "$NS" create secret generic kiln-signing --from-file="$WORK/keys" >/dev/null
start_operator 1 --signing-secret kiln-signing --trust-key "$WORK/keys/signing.pub"
wait_for "operator /readyz" 60 curl -fsS http://127.0.0.1:18081/readyz

# exec_target NAME MAX_ATTEMPTS IMAGE SCRIPT: the example's target with an exec backend.
exec_target() {
  jq -n --arg name "$1" --argjson attempts "$2" --arg image "$3" --arg script "$4" '{
    apiVersion: "kiln.dev/v1alpha1", kind: "CompiledTarget", metadata: {name: $name},
    spec: {modelRef: {name: "squeezenet"},
      backend: {kind: "exec", image: $image, command: ["sh", "-c", $script]},
      precision: "fp32", profiles: [{name: "batch1", dims: {batch: 1}}],
      compile: {maxAttempts: $attempts},
      warmup: {iterations: 3, fixtureVersion: "v1", defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}}}'
}

echo "== an exec target compiles in $COMPILER with kiln-agent injected"
# The example's ModelArtifact alone (the document before the first ---).
awk '/^---/ {exit} {print}' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null
# shellcheck disable=SC2016 # expanded by sh in the compiler container
exec_target sq-exec 2 "$COMPILER" 'echo "compiling $(basename "$KILN_MODEL") for $KILN_PROFILES in busybox"; cp "$KILN_MODEL" "$KILN_ARTIFACT"' |
  kubectl -n "$NS" apply -f - >/dev/null
compiled() {
  # ModelNotFound passes once the operator's cache has the ModelArtifact applied just before.
  [[ $(cond sq-exec Stalled status) != True || $(cond sq-exec Stalled reason) == ModelNotFound ]] ||
    die "sq-exec Stalled: $(cond sq-exec Stalled message)"
  [[ -n $(kubectl -n "$NS" get compiledtarget sq-exec -o jsonpath='{.status.revisions[0].artifacts[0].digest}') ]]
}
wait_for "sq-exec revision 1" 240 compiled
status=$(kubectl -n "$NS" get compiledtarget sq-exec -o json)
KEY=$(jq -r '.status.classes[0].compileKey' <<<"$status")
DIGEST=$(jq -r '.status.classes[0].artifactDigest' <<<"$status")
[[ $(sha256sum <"$WORK/store/artifacts/$KEY/artifact" | cut -d' ' -f1) == "$DIGEST" ]] ||
  die "stored artifact does not hash to the digest in status"
jq -e '.backend == "exec" and (.converterLog | any(test("compiling model.onnx for .*batch1.* in busybox")))' \
  "$WORK/store/artifacts/$KEY/manifest.json" >/dev/null ||
  die "build manifest: $(jq -c '{backend, converterLog}' "$WORK/store/artifacts/$KEY/manifest.json")"
job=$(kubectl -n "$NS" get jobs -o json | jq -c '[.items[] | select(.metadata.ownerReferences[0].name == "sq-exec")][0]')
jq -e --arg c "$COMPILER" '.spec.template.spec as $p
  | $p.initContainers[0].image == "kiln-e2e/agent:test"
  and $p.initContainers[0].args == ["install", "/kiln/tools"]
  and $p.initContainers[1].image == $c
  and $p.initContainers[1].command[0] == "/kiln/tools/ld.so"
  and ([$p.initContainers[1].env[].name] | any(. == "KILN_SIGNING_KEY" or . == "KILN_STORE") | not)
  and ([$p.initContainers[1].volumeMounts[].name] | any(. == "signing" or . == "store") | not)
  and $p.containers[0].image == "kiln-e2e/agent:test"' <<<"$job" >/dev/null ||
  die "Job is not the injected shape: $(jq -c .spec.template.spec <<<"$job")"
pod=$(kubectl -n "$NS" get pods -l "job-name=$(jq -r .metadata.name <<<"$job")" -o json | jq -c '.items[0]')
[[ $(jq -r .status.phase <<<"$pod") == Succeeded ]] || die "compile pod: $(jq -c .status <<<"$pod")"
pod_name=$(jq -r .metadata.name <<<"$pod")
kubectl -n "$NS" logs "$pod_name" -c kiln-tools | jq -e '.libraries | index("libc.so.6")' >/dev/null ||
  die "init container did not install libc: $(kubectl -n "$NS" logs "$pod_name" -c kiln-tools)"
kubectl -n "$NS" logs "$pod_name" -c compiler | grep -c 'in busybox' >/dev/null ||
  die "compiler output missing from the Job log"
att=$WORK/store/artifacts/$KEY/attestation-$(jq -r '.status.classes[0].manifestDigest' <<<"$status" | cut -d: -f2).json
jq -e --arg c "$COMPILER" '.payload | @base64d | fromjson | .predicate.buildDefinition.resolvedDependencies
  | any(.name == "builder-image" and .uri == "oci://" + $c)' "$att" >/dev/null ||
  die "no signed provenance naming the compiler image at $att"
echo "   key $KEY -> sha256:$DIGEST, built in a libc-less image"

echo "== a failing compiler stalls with CompileFailed and its last output"
# shellcheck disable=SC2016
exec_target sq-broken 1 "$COMPILER" 'echo "loading graph"; echo "fatal: opset 9 is not supported" >&2; exit 3' |
  kubectl -n "$NS" apply -f - >/dev/null
wait_for "sq-broken Stalled" 180 cond_is sq-broken Stalled True CompileFailed
msg=$(cond sq-broken Stalled message)
[[ $msg == *"exited with status 3"* && $msg == *"fatal: opset 9 is not supported"* ]] ||
  die "Stalled message lacks the compiler's words: $msg"
echo "   $msg" | cut -c1-200

echo "== admission refuses an unpinned compiler image and a command without exec"
out=$(exec_target sq-tag 1 "docker.io/$BUSYBOX_IMAGE" 'true' | kubectl -n "$NS" apply -f - 2>&1) &&
  die "tag-pinned image admitted"
[[ $out == *"pin backend.image by digest"* ]] || die "unexpected admission error: $out"
out=$(exec_target sq-tract 1 "$COMPILER" 'true' | jq '.spec.backend.kind = "tract"' | kubectl -n "$NS" apply -f - 2>&1) &&
  die "tract with a compiler image admitted"
[[ $out == *"are for kind exec"* ]] || die "unexpected admission error: $out"
echo "compile-exec e2e passed"
