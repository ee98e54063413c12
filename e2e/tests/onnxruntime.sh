#!/usr/bin/env bash
# backend.kind onnxruntime on the real cluster, installed by the chart with the store on the
# cluster's registry: the agent image carries the ONNX Runtime library of
# scripts/ensure-onnxruntime.sh (ORT_DYLIB_PATH in the image) and the operator keys on its
# version and sha256 (backends.onnxruntime). The example model, targeted by a tract and an
# onnxruntime CompiledTarget: two compile Jobs, two artifacts in the registry (the ONNX Runtime
# one's build manifest names the library and its placement), the target's class row and the
# node's KilnNode row both show the partition evidence (every node on the CPU provider, one
# partition, no fallback), the row the engine's peak memory, the agent's metrics export both, and the node reports the runtime in its
# hardware facts. Then a target asking for the CUDA provider, which the CPU library lacks, fails
# (never served on the CPU instead). Throughout, each engine is loaded once: a new target,
# annotations and an unrelated node label make the agent look again but load nothing again.
# Last, the example with backend.kind auto: the compile Job builds and measures both engines, the
# class row and the registry's build manifest say which it kept and why, and the node serves it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
source "$(dirname "$0")/observe-lib.sh"
kiln_test ort
teardown() { kubectl label node "$REAL" example.com/unrelated- >/dev/null 2>&1 || true; }

kiln_images "$WORK"
kiln_example_dirs "$WORK"

echo "== install with ONNX Runtime $ORT_IDENTITY in the agent image"
kiln_fresh_crds
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"
wait_for "KilnNode $REAL reports the onnxruntime runtime" 60 \
  bash -c "kubectl get kilnnode $REAL -o json | jq -e '.status.hardware.runtimes.onnxruntime == \"${ORT_IDENTITY%%@*}\"'"

echo "== the example on tract and on onnxruntime"
t0=$SECONDS
{
  cat "$REPO/examples/squeezenet/kiln.yaml"
  printf -- '---\n'
  sed -e 's/name: squeezenet-cpu/name: squeezenet-ort/' -e 's/kind: tract/kind: onnxruntime/' \
    <(awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' "$REPO/examples/squeezenet/kiln.yaml")
} | kubectl -n "$NS" apply -f - >/dev/null || die "apply"
row() { kubectl get kilnnode "$REAL" -o json | jq -c --arg ns "$NS" --arg t "$1" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
for t in squeezenet-cpu squeezenet-ort; do
  wait_for "$t Ready on $REAL" 300 bash -c "[[ \$(kubectl get kilnnode $REAL -o json | jq -r --arg ns $NS --arg t $t '.status.targets[]? | select(.namespace == \$ns and .name == \$t) | .phase') == Ready ]]"
done
echo "   both Ready $((SECONDS - t0))s after apply"

ORT=$(kubectl -n "$NS" get compiledtarget squeezenet-ort -o json)
TRACT=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json)
[[ $(jq -r '.status.classes[0].compileKey' <<<"$ORT") != $(jq -r '.status.classes[0].compileKey' <<<"$TRACT") ]] ||
  die "the two backends share a compile key"
echo "== the class row carries the compile's placement"
jq -e '.status.classes[0].placement | .requested == "cpu" and .nodes.cpu > 10 and (.nodes | length) == 1 and
  .partitions == 1 and .fallbackNodeCount == 0 and .fallbackShare == 0' <<<"$ORT" >/dev/null ||
  die "onnxruntime class placement: $(jq -c '.status.classes[0].placement' <<<"$ORT")"
jq -e '.status.classes[0].placement | .requested == "tract" and .nodes.tract > 0 and .partitions == 1' <<<"$TRACT" >/dev/null ||
  die "tract class placement: $(jq -c '.status.classes[0].placement' <<<"$TRACT")"
echo "   onnxruntime $(jq -c '.status.classes[0].placement.nodes' <<<"$ORT"), tract $(jq -c '.status.classes[0].placement.nodes' <<<"$TRACT")"

echo "== the node's row carries its own warmup's placement"
ROW=$(row squeezenet-ort)
jq -e '(.placement | .requested == "cpu" and .nodes.cpu > 10 and .partitions == 1 and .fallbackShare == 0) and
  .peakMemoryBytes > 0 and .p50Seconds > 0 and .firstRequestSeconds > 0' <<<"$ROW" >/dev/null || die "onnxruntime row: $ROW"
echo "   row: $(jq -c '{placement: .placement.nodes, peakMemoryBytes, p50Seconds, firstRequestSeconds,
  firstRequestOverP50: (.firstRequestSeconds / .p50Seconds * 100 | round / 100)}' <<<"$ROW")"
[[ $(jq -r '.artifactDigest' <<<"$ROW") == *"$(jq -r '.status.classes[0].artifactDigest' <<<"$ORT")" ]] ||
  die "row digest $(jq -r .artifactDigest <<<"$ROW") is not the class's"

echo "== the registry's build manifest names the library and the placement"
build=$(build_manifest "$(jq -r '.status.classes[0].compileKey' <<<"$ORT")") || die "$build"
jq -e --arg sha "${ORT_IDENTITY##*@sha256:}" '.backend == "onnxruntime" and .backendVersion == "1.31.1" and
  .runtimeDigest == $sha and .placement.nodes.cpu > 10 and .backendOptions.optimizationLevel == "extended"' <<<"$build" >/dev/null ||
  die "build manifest: $(jq -c '{backend, backendVersion, runtimeDigest, placement, backendOptions}' <<<"$build")"

echo "== the agent's metrics export the placement"
m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics") || die "no agent /metrics"
series() { printf '^kiln_agent_%s\\{namespace="%s",target="%s",class="[^"]+"%s\\} ' "$1" "$NS" "$2" "${3:+,provider=\"$3\"}"; }
grep -Eq "$(series partition_nodes squeezenet-ort cpu)[1-9]" <<<"$m" || die "no cpu partition_nodes: $(grep partition <<<"$m")"
grep -Eq "$(series partition_nodes squeezenet-cpu tract)[1-9]" <<<"$m" || die "no tract partition_nodes: $(grep partition <<<"$m")"
grep -Eq "$(series fallback_share squeezenet-ort)0" <<<"$m" || die "no fallback_share: $(grep fallback_share <<<"$m")"
grep -Eq "$(series engine_peak_memory_bytes squeezenet-ort)[1-9]" <<<"$m" || die "no engine_peak_memory_bytes: $(grep peak <<<"$m")"
promtool check metrics <<<"$m" || die "promtool rejects the agent's exposition"

echo "== a provider the library lacks fails, it is not served on the CPU"
kubectl -n "$NS" apply -f - >/dev/null <<YAML || die "apply cuda target"
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: squeezenet-cuda}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: onnxruntime, executionProvider: cuda}
  compile: {maxAttempts: 1}
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {iterations: 2, fixtureVersion: v1}
YAML
wait_for "squeezenet-cuda Stalled" 180 bash -c "kubectl -n $NS get compiledtarget squeezenet-cuda -o json | jq -e '.status.conditions[]? | select(.type == \"Stalled\" and .status == \"True\")'"
CUDA=$(kubectl -n "$NS" get compiledtarget squeezenet-cuda -o json)
jq -e '.status.classes[0] | .phase == "Failed" and .reason == "IncompatibleRuntime" and (.message | test("CUDA"))' <<<"$CUDA" >/dev/null ||
  die "cuda target: $(jq -c '.status.classes[0] | {phase, reason, message}' <<<"$CUDA")"
[[ -z $(row squeezenet-cuda | jq -r 'select(.phase == "Ready")') ]] || die "the cuda target is Ready on a CPU-only node"
echo "   $(jq -r '.status.classes[0].reason + ": " + (.status.classes[0].message | .[0:160])' <<<"$CUDA")"

echo "== no redundant node work: each engine was loaded once, and unrelated events load none again"
# loads VAR: the agent's engine loads (a counter bumped at each load), read through its Service; a
# scrape that fails or lacks the metric fails the test instead of reading 0.
loads() { metric_sum "$1" kiln_agent_load_seconds_count kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics"; }
since() { row "$1" | jq -r .readySince; }
loads before
ort_since=$(since squeezenet-ort) tract_since=$(since squeezenet-cpu)
# shellcheck disable=SC2154 # before: set by loads
[[ $before == 2 ]] || die "$before loads for two targets (the cuda one never had an artifact)"
kubectl -n "$NS" annotate compiledtarget squeezenet-ort example.com/note=unrelated >/dev/null
kubectl -n "$NS" annotate modelartifact squeezenet example.com/note=unrelated >/dev/null
kubectl label node "$REAL" example.com/unrelated=1 >/dev/null
# The counter covers the whole window; the agent has no count of its looks, so the window's
# length is what gives it time to load again by mistake.
sleep 10
loads after
# shellcheck disable=SC2154 # after: set by loads
[[ $after == "$before" ]] || die "unrelated events reloaded an engine: $before -> $after loads"
[[ $(since squeezenet-ort) == "$ort_since" && $(since squeezenet-cpu) == "$tract_since" ]] ||
  die "readySince moved: $(row squeezenet-ort)"
echo "   $before loads for 2 served targets after a new target, 2 annotations and a node label"

echo "== backend auto: both engines built, checked and measured in the Job, the kept one served"
t0=$SECONDS
awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' "$REPO/examples/squeezenet/auto.yaml" |
  kubectl -n "$NS" apply -f - >/dev/null || die "apply auto target"
wait_for "squeezenet-auto Ready on $REAL" 300 bash -c "[[ \$(kubectl get kilnnode $REAL -o json | jq -r --arg ns $NS '.status.targets[]? | select(.namespace == \$ns and .name == \"squeezenet-auto\") | .phase') == Ready ]]"
AUTO=$(kubectl -n "$NS" get compiledtarget squeezenet-auto -o json)
engine=$(jq -r '.status.classes[0].engine' <<<"$AUTO")
[[ $engine == tract || $engine == onnxruntime/cpu ]] || die "auto class row engine: $engine"
jq -e --arg e "$engine" '.status.classes[0].engineReason | startswith($e + " kept: p50")' <<<"$AUTO" >/dev/null ||
  die "auto engineReason: $(jq -c '.status.classes[0].engineReason' <<<"$AUTO")"
build=$(build_manifest "$(jq -r '.status.classes[0].compileKey' <<<"$AUTO")") || die "$build"
jq -e --arg e "$engine" '.selection.engine == $e and ([.selection.candidates[] | select(.passed and .p50Seconds > 0) | .engine] ==
  ["tract", "onnxruntime/cpu"]) and (.backend == ($e | split("/") | .[0]))' <<<"$build" >/dev/null ||
  die "auto build manifest: $(jq -c '{backend, selection}' <<<"$build")"
[[ $(row squeezenet-auto | jq -r .artifactDigest) == *"$(jq -r '.status.classes[0].artifactDigest' <<<"$AUTO")" ]] ||
  die "the node serves another artifact than the class's: $(row squeezenet-auto)"
echo "   Ready $((SECONDS - t0))s after apply on $engine: $(jq -r '.status.classes[0].engineReason' <<<"$AUTO" | cut -c1-200)"
