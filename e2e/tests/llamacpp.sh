#!/usr/bin/env bash
# backend.kind llamacpp on the real cluster: the GGUF example (examples/tiny-llama, a llama
# architecture with random weights and its tokenizer inside) installed by the chart with the store
# on the cluster's registry, targeted at Q8_0 (the example) and F16. Each gets its own compile Job
# and compile key; the registry's build manifest names llama.cpp's version and the weight type
# the compile kept with the sizes; the node's KilnNode row carries the prompt's prefill time and
# the decode rate, and the agent's metrics export both. Then an ONNX engine asked to run the GGUF
# model is refused by the operator before any Job (BackendUnavailable).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test llama

kiln_images "$WORK"
kiln_example_dirs "$WORK"
cp "$REPO/examples/tiny-llama/model.gguf" "$WORK/sources/tiny-llama.gguf"
cp "$REPO/examples/tiny-llama/fixture-v1.safetensors" "$WORK/sources/tiny-llama-fixture-v1.safetensors"
chmod 644 "$WORK/sources/"*

echo "== install"
kiln_fresh_crds
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"
wait_for "KilnNode $REAL reports the llamacpp runtime" 60 \
  bash -c "kubectl get kilnnode $REAL -o json | jq -e '.status.hardware.runtimes.llamacpp == \"0.1.160\"'"

echo "== the GGUF example at Q8_0 and at F16"
t0=$SECONDS
example=$(sed -e 's|file://model.gguf|file://tiny-llama.gguf|' \
  -e 's|file://fixture-v1.safetensors|file://tiny-llama-fixture-v1.safetensors|' "$REPO/examples/tiny-llama/kiln.yaml")
{
  printf '%s\n---\n' "$example"
  awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' <<<"$example" |
    sed -e 's/name: tiny-llama-q8/name: tiny-llama-f16/' -e 's/quantization: Q8_0/quantization: F16/'
} | kubectl -n "$NS" apply -f - >/dev/null || die "apply"
row() { kubectl get kilnnode "$REAL" -o json | jq -c --arg ns "$NS" --arg t "$1" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
for t in tiny-llama-q8 tiny-llama-f16; do
  wait_for "$t Ready on $REAL" 300 bash -c "[[ \$(kubectl get kilnnode $REAL -o json | jq -r --arg ns $NS --arg t $t '.status.targets[]? | select(.namespace == \$ns and .name == \$t) | .phase') == Ready ]]"
done
echo "   both Ready $((SECONDS - t0))s after apply"

Q8=$(kubectl -n "$NS" get compiledtarget tiny-llama-q8 -o json)
F16=$(kubectl -n "$NS" get compiledtarget tiny-llama-f16 -o json)
[[ $(jq -r '.status.classes[0].compileKey' <<<"$Q8") != $(jq -r '.status.classes[0].compileKey' <<<"$F16") ]] ||
  die "the two weight types share a compile key"
jq -e '.status.classes[0].engine == "llamacpp"' <<<"$Q8" >/dev/null || die "class engine: $(jq -c '.status.classes[0]' <<<"$Q8")"

echo "== the registry's build manifests name llama.cpp and the weight type kept"
build() {
  local key manifest
  key=$(jq -r '.status.classes[0].compileKey' <<<"$1")
  manifest=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$key") ||
    return 1
  curl -fsS "http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/$(jq -r '.config.digest' <<<"$manifest")"
}
for pair in "Q8_0:$Q8" "F16:$F16"; do
  want=${pair%%:*} b=$(build "${pair#*:}") || die "no build manifest for $want"
  jq -e --arg w "$want" '.backend == "llamacpp" and .backendVersion == "0.1.160" and
    .backendOptions["llamacpp.weights"] == $w and (.backendOptions["llamacpp.ggufBytes"] | tonumber) > 0 and
    (.backendOptions["llamacpp.ggufBytes"] | tonumber) < (.backendOptions["llamacpp.sourceBytes"] | tonumber)' <<<"$b" >/dev/null ||
    die "$want build manifest: $(jq -c '{backend, backendVersion, backendOptions}' <<<"$b")"
  echo "   $want: $(jq -r '.backendOptions | "\(.["llamacpp.sourceBytes"]) -> \(.["llamacpp.ggufBytes"]) bytes"' <<<"$b")"
done

echo "== the node's row and the agent's metrics carry the generation figures"
ROW=$(row tiny-llama-q8)
jq -e '.generation | .promptTokens == 8 and .generatedTokens == 6 and .prefillSeconds > 0 and .decodeTokensPerSecond > 0' \
  <<<"$ROW" >/dev/null || die "row: $ROW"
echo "   row: $(jq -c '{generation, p50Seconds, peakMemoryBytes}' <<<"$ROW")"
m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics") || die "no agent /metrics"
for s in prefill_seconds decode_tokens_per_second; do
  grep -Eq "^kiln_agent_${s}\\{namespace=\"$NS\",target=\"tiny-llama-q8\",class=\"[^\"]+\"\\} [0-9.e-]*[1-9]" <<<"$m" ||
    die "no $s: $(grep "$s" <<<"$m")"
done
promtool check metrics <<<"$m" || die "promtool rejects the agent's exposition"

echo "== a GGUF model on an ONNX engine is refused before any compile"
kubectl -n "$NS" apply -f - >/dev/null <<YAML || die "apply tract target"
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: tiny-llama-tract}
spec:
  modelRef: {name: tiny-llama}
  backend: {kind: tract}
  profiles: [{name: prompt8, dims: {len: 8}}]
  warmup: {iterations: 2, fixtureVersion: v1}
YAML
wait_for "tiny-llama-tract Stalled" 60 bash -c "kubectl -n $NS get compiledtarget tiny-llama-tract -o json | jq -e '.status.conditions[]? | select(.type == \"Stalled\" and .status == \"True\" and .reason == \"BackendUnavailable\")'"
[[ -z $(kubectl -n "$NS" get jobs -o name | grep tiny-llama-tract) ]] || die "a compile Job for the refused target"
echo "   $(kubectl -n "$NS" get compiledtarget tiny-llama-tract -o json | jq -r '.status.conditions[] | select(.type == "Stalled") | .message')"
