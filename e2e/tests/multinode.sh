#!/usr/bin/env bash
# Two real nodes, two classes (needs e2e/cluster up --nodes 2; skipped on one node): kiln
# installed by its chart (one cache directory per node under the shared cacheHostPath), the
# nodes differing only in a pool label that the target lists in classLabelKeys.
#   * Exactly two compile Jobs, each running on its own class's node (the Job's node selector
#     is that node's class label, asserted from the pod's spec.nodeName); compile keys and
#     build manifests differ per class; each node's agent serves its own class's artifact; both
#     class rows Ready with one node each; a serving pod on each node turns Ready.
#   * Failure isolation: the artifact the second node pulls corrupted in the registry and that
#     node's cache wiped (its agent restarted): that node fails closed (row Failed, HashMismatch,
#     gate False, readiness label gone, the target names the class and node) while the first
#     node, serving from its verified cache, stays Ready and its serving pod never loses
#     readiness (watched). Repaired, it serves again.
#   * The second class's build manifest corrupted in the registry: the operator treats the entry
#     as absent and has that class (only) rebuilt on its node, which replaces the entry.
#   * A node leaves (e2e/cluster stop-node, Node deleted): its KilnNode is garbage-collected
#     (owned by the Node), the target counts one class, the first node untouched; it comes back
#     (start-node, pool label set again as a node pool controller would): warmed again from its
#     cache, with no new compile Job.
#   * A GGUF language model (examples/tiny-llama) at Q8_0 over the same two classes: a compile
#     key per class, both rows Ready on llama.cpp, each node serving its class's artifact with
#     its generation figures (the quantised bytes are the same: llama.cpp's quantiser is
#     deterministic).
# Prints the time of each step.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
source "$(dirname "$0")/observe-lib.sh"
mapfile -t NODES < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
((${#NODES[@]} >= 2)) || skip "one node; run e2e/cluster up --nodes 2"
A=${NODES[0]} B=${NODES[1]}
ensure_busybox
kiln_test multinode
T=sq
POOL=example.com/pool
BLOB=
teardown() {
  watch_stop
  [[ -z $BLOB ]] || flip "$BLOB"
  # A node taken away by the test comes back for the next one.
  kubectl get node "$B" >/dev/null 2>&1 || "$E2E_DIR/cluster" start-node "$B" >/dev/null 2>&1 || true
  kubectl label node "$A" "$B" "$POOL-" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$B" --ignore-not-found >/dev/null 2>&1 || true
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

kubectl label node "$A" "$POOL=a" --overwrite >/dev/null
kubectl label node "$B" "$POOL=b" --overwrite >/dev/null
kiln_images "$WORK"
kiln_example_dirs "$WORK"
kiln_fresh_crds
# Both nodes share one host here but not one kubelet directory, which the CSI plugin DaemonSet
# takes from one value (csi.kubeletDir): off, as this test mounts no model volume.
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" --set agent.cachePerNode=true --set csi.enabled=false || die "kiln did not come up"
wait_for "an agent on each node" 60 bash -c "kubectl -n $NS get pods -l app.kubernetes.io/component=agent -o json |
  jq -e '[.items[] | select(.status.phase == \"Running\") | .spec.nodeName] | sort == [\"$A\", \"$B\"]'"

ct() { kubectl -n "$NS" get compiledtarget "$T" -o json; }
ctq() { ct | jq -e "$@" >/dev/null; }
row() { kubectl get kilnnode "$1" -o json 2>/dev/null | jq -c --arg ns "$NS" --arg t "$T" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
rowq() { local n=$1; shift; row "$n" | jq -e "$@" >/dev/null; }
pod_ready() { kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastTransitionTime}'; }
jobs_created() { event_count "$NS" CompileJobCreated; }
# ready_or_stalled SECS: waits until the target $T is Ready; fails at once when it is Stalled.
ready_or_stalled() {
  local end=$((SECONDS + $1))
  until ctq '.status.conditions[]? | select(.type == "Ready" and .status == "True")'; do
    ctq '.status.conditions[]? | select(.type == "Stalled" and .status == "True")' &&
      die "$T Stalled: $(ct | jq -r '.status.conditions[] | select(.type == "Stalled") | .message')"
    ((SECONDS < end)) || die "$T not Ready after $1 s"
    sleep 0.5
  done
}

echo "== one target over two classes: a Job per class, each on its own node"
t0=$(now)
awk '/^---/ {exit} /^apiVersion/ {on = 1} on' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null || die "apply model"
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $T}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: batch1, dims: {batch: 1}}]
  classLabelKeys: [kubernetes.io/arch, kiln.dev/cpu-level, $POOL]
  warmup: {iterations: 5, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}
YAML
serving_pod "$NS" "$T" "$A" serve-a
serving_pod "$NS" "$T" "$B" serve-b
ready_or_stalled 300
echo "   applied -> both classes Ready: $(since "$t0") s"
ctq '.status.classCount == 2 and (.status.classes | length) == 2 and
  all(.status.classes[]; .phase == "Ready" and .nodes == 1 and .readyNodes == 1 and .failedNodes == 0)' ||
  die "class rows: $(ct | jq -c '[.status.classes[] | {class, phase, nodes, readyNodes}]')"
mapfile -t JOBS < <(kubectl -n "$NS" get jobs -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
((${#JOBS[@]} == 2)) || die "want 2 compile Jobs, got ${#JOBS[@]}: ${JOBS[*]}"
(($(jobs_created) == 2)) || die "CompileJobCreated events: $(kubectl -n "$NS" get events -o json | jq -c '[.items[] | select(.reason == "CompileJobCreated") | {message, count, series, involvedObject: .involvedObject.name}]')"
declare -A JOB_NODE
for j in "${JOBS[@]}"; do
  sel=$(kubectl -n "$NS" get job "$j" -o json | jq -c '.spec.template.spec.nodeSelector')
  node=$(kubectl -n "$NS" get pods -l "job-name=$j" -o jsonpath='{.items[0].spec.nodeName}')
  [[ -n $node ]] || die "Job $j has no pod"
  kubectl get node "$node" -o json | jq -e --argjson sel "$sel" '.metadata.labels as $l | all($sel | to_entries[]; $l[.key] == .value)' >/dev/null ||
    die "Job $j (nodeSelector $sel) ran on $node, which does not carry its class label"
  JOB_NODE[$node]=$j
  echo "   Job $j ran on $node ($sel)"
done
[[ -n ${JOB_NODE[$A]:-} && -n ${JOB_NODE[$B]:-} ]] || die "both Jobs did not run on distinct nodes: ${!JOB_NODE[*]}"
# The label that carries this target's class ids (its own key set: kiln.dev/class-<hash>).
CLASS_KEY=$(kubectl -n "$NS" get job "${JOBS[0]}" -o json | jq -r '.spec.template.spec.nodeSelector | keys[0]')
class_of() { kubectl get node "$1" -o json | jq -r --arg k "$CLASS_KEY" '.metadata.labels[$k] // empty'; }
CA=$(class_of "$A") CB=$(class_of "$B")
[[ -n $CA && -n $CB && $CA != "$CB" ]] || die "class labels: $A=$CA $B=$CB"
crow() { ct | jq -c --arg c "$1" '.status.classes[] | select(.class == $c)'; }
[[ $(crow "$CA" | jq -r .compileKey) != $(crow "$CB" | jq -r .compileKey) ]] || die "the two classes share a compile key"
[[ $(crow "$CA" | jq -r .manifestDigest) != $(crow "$CB" | jq -r .manifestDigest) ]] || die "the two classes share a build manifest"
for n in "$A" "$B"; do
  c=$(class_of "$n")
  rowq "$n" --arg c "$c" --arg d "$(crow "$c" | jq -r '.artifactDigest | sub("^sha256:"; "")')" \
    '.phase == "Ready" and .class == $c and (.artifactDigest | sub("^sha256:"; "")) == $d' ||
    die "$n does not serve its class $c: $(row "$n")"
  [[ $(kubectl get node "$n" -o json | jq -r --arg k "$NS.ready.kiln.dev/$T" '.metadata.labels[$k]') == 1 ]] || die "$n has no readiness label"
done
same=$([[ $(crow "$CA" | jq -r .artifactDigest) == $(crow "$CB" | jq -r .artifactDigest) ]] && echo "the same engine bytes" || echo "different engine bytes")
echo "   $A serves $CA, $B serves $CB: keys and build manifests differ ($same)"
for p in serve-a serve-b; do
  wait_for "$p Ready" 60 bash -c "[[ \$(kubectl -n $NS get pod $p -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
done
READY_A=$(pod_ready serve-a)
# serve-a's readiness from here until the node's return: a watch that begins with its state.
watch_object "$WORK/serve-a.watch" "/api/v1/namespaces/$NS/pods" serve-a

echo "== failure isolation: $B's artifact corrupted in the registry, its cache wiped"
# Both classes compiled to the same engine bytes, so their artifacts are one blob: $A serves it
# from its verified cache and never pulls again; $B, its cache wiped, must pull it.
LAYER=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
  "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$(crow "$CB" | jq -r .manifestDigest)" | jq -r '.layers[0].digest')
blob_path() { echo "$REGISTRY_DIR/docker/registry/v2/blobs/sha256/${1:7:2}/${1:7}/data"; }
[[ -f $(blob_path "$LAYER") ]] || die "no blob at $(blob_path "$LAYER")"
flip "$(blob_path "$LAYER")"
BLOB=$(blob_path "$LAYER")
restart_agent_b() {
  kubectl -n "$NS" delete pod -l app.kubernetes.io/component=agent --field-selector "spec.nodeName=$B" --wait=false >/dev/null
}
rm -rf "${WORK:?}/cache/$B"
t0=$(now)
restart_agent_b
wait_for "$B fails closed" 120 rowq "$B" '.phase == "Failed" and .reason == "HashMismatch"'
echo "   $B failed closed $(since "$t0") s after its agent restarted: $(row "$B" | jq -r .message | cut -c1-120)…"
wait_for "serve-b gate False" 60 bash -c "[[ \$(kubectl -n $NS get pod serve-b -o jsonpath='{.status.conditions[?(@.type==\"kiln.dev/warm\")].status}') == False ]]"
wait_for "$B loses its readiness label" 60 bash -c "kubectl get node $B -o json | jq -e --arg k '$NS.ready.kiln.dev/$T' '.metadata.labels[\$k] == null'"
wait_for "the target names the failing class and node" 60 ctq --arg c "$CB" --arg n "$B" \
  '.status.classes[] | select(.class == $c) | .failedNodes == 1 and .failingNodes == [$n] and .reason == "HashMismatch"'
ctq '.status.conditions[] | select(.type == "Ready") | .status == "False"' || die "target still Ready"
ctq --arg c "$CA" '.status.classes[] | select(.class == $c) | .phase == "Ready" and .readyNodes == 1' || die "$A's class row: $(crow "$CA")"
rowq "$A" '.phase == "Ready"' || die "$A stopped serving: $(row "$A")"
[[ $(pod_ready serve-a) == "$READY_A" ]] || die "serve-a readiness changed: $READY_A -> $(pod_ready serve-a)"
echo "   $(ct | jq -r '.status.conditions[] | select(.type == "Ready") | .message' | cut -c1-200)"
flip "$BLOB"
BLOB=
t0=$(now)
restart_agent_b
wait_for "$B serves again after the repair" 120 rowq "$B" '.phase == "Ready"'
echo "   repaired: $B Ready again $(since "$t0") s after its agent restarted"

echo "== $B's build manifest corrupted in the registry: the operator has that class rebuilt"
CONFIG=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
  "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$(crow "$CB" | jq -r .manifestDigest)" | jq -r .config.digest)
OLD_MANIFEST_B=$(crow "$CB" | jq -r .manifestDigest)
flip "$(blob_path "$CONFIG")"
BLOB=$(blob_path "$CONFIG")
t0=$(now)
# A running operator remembers the entry it verified (operator/src/recall/lookups.rs) until a node
# reports it broken or it restarts: restarted, it reads the store again.
kubectl -n "$NS" rollout restart deploy/kiln-operator >/dev/null || die "restarting the operator"
wait_for "class $CB rebuilt under a new build manifest" 180 ctq --arg c "$CB" --arg m "$OLD_MANIFEST_B" \
  '.status.classes[] | select(.class == $c) | .phase == "Ready" and .manifestDigest != $m'
echo "   corrupt build manifest -> class $CB rebuilt and Ready again: $(since "$t0") s"
(($(jobs_created) == 3)) || die "want one more compile Job (for $CB only): $(jobs_created) CompileJobCreated events"
J3=$(kubectl -n "$NS" get jobs -o json | jq -r --arg c "$CB" '.items[] | select(.spec.template.spec.nodeSelector | to_entries[0].value == $c) | select(.status.succeeded == 1) | .metadata.name' | tail -1)
[[ $(kubectl -n "$NS" get pods -l "job-name=$J3" -o jsonpath='{.items[0].spec.nodeName}') == "$B" ]] || die "the rebuild Job $J3 did not run on $B"
wait_for "both nodes Ready" 120 bash -c "kubectl get kilnnode $A $B -o json | jq -e --arg ns $NS '[.items[].status.targets[] | select(.namespace == \$ns) | .phase] == [\"Ready\", \"Ready\"]'"
flip "$BLOB"
BLOB=
[[ $(pod_ready serve-a) == "$READY_A" ]] || die "serve-a readiness changed: $READY_A -> $(pod_ready serve-a)"

echo "== $B leaves the cluster and comes back"
"$E2E_DIR/cluster" stop-node "$B" >/dev/null 2>&1 || die "stop-node $B"
t0=$(now)
kubectl delete node "$B" --wait=true >/dev/null || die "delete node $B"
wait_for "KilnNode $B garbage-collected" 120 bash -c "! kubectl get kilnnode $B >/dev/null 2>&1"
echo "   node deleted -> KilnNode garbage-collected: $(since "$t0") s"
wait_for "the target counts one class" 180 ctq --arg c "$CA" \
  '.status.classCount == 1 and [.status.classes[].class] == [$c] and (.status.conditions[] | select(.type == "Ready") | .status == "True")'
echo "   node deleted -> target Ready on one class: $(since "$t0") s"
rowq "$A" '.phase == "Ready"' || die "$A stopped serving: $(row "$A")"
[[ $(pod_ready serve-a) == "$READY_A" ]] || die "serve-a readiness changed: $READY_A -> $(pod_ready serve-a)"
t0=$(now)
"$E2E_DIR/cluster" start-node "$B" >/dev/null 2>&1 || die "start-node $B"
wait_for "Node $B registered again" 60 kubectl get node "$B"
kubectl label node "$B" "$POOL=b" --overwrite >/dev/null
wait_for "$B warmed again" 180 rowq "$B" '.phase == "Ready"'
echo "   node back -> Ready again: $(since "$t0") s"
rowq "$B" '(.pullBytes // 0) == 0' || die "$B pulled again although its cache survived: $(row "$B")"
wait_for "$B labelled with its class again" 60 bash -c "[[ \$(kubectl get node $B -o json | jq -r --arg k '$CLASS_KEY' '.metadata.labels[\$k] // empty') == $CB ]]"
wait_for "both classes Ready" 60 ctq '.status.classCount == 2 and all(.status.classes[]; .phase == "Ready")'
(($(jobs_created) == 3)) || die "the node's return compiled again: $(jobs_created) CompileJobCreated events"
kubectl get kilnnode "$B" -o json | jq -e --arg n "$B" '.metadata.ownerReferences[0] | .kind == "Node" and .name == $n' >/dev/null ||
  die "KilnNode $B is not owned by its Node: $(kubectl get kilnnode "$B" -o json | jq -c .metadata.ownerReferences)"
ready_never_false "$WORK/serve-a.watch" "/api/v1/namespaces/$NS/pods" serve-a
echo "   serve-a on $A stayed Ready throughout"

echo "== a GGUF language model quantised per class: a Q8_0 artifact for each class, each node its own"
t0=$(now)
cp "$REPO/examples/tiny-llama/model.gguf" "$WORK/sources/tiny-llama.gguf"
cp "$REPO/examples/tiny-llama/fixture-v1.safetensors" "$WORK/sources/tiny-llama-fixture-v1.safetensors"
chmod 644 "$WORK/sources/"*
sed -e 's|file://model.gguf|file://tiny-llama.gguf|' -e 's|file://fixture-v1.safetensors|file://tiny-llama-fixture-v1.safetensors|' \
  -e "s|^  profiles:|  classLabelKeys: [kubernetes.io/arch, kiln.dev/cpu-level, $POOL]\n  profiles:|" \
  "$REPO/examples/tiny-llama/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null || die "apply the GGUF example"
T=tiny-llama-q8
ready_or_stalled 300
echo "   apply -> $T Ready on both classes: $(since "$t0") s"
ctq '.status.classCount == 2 and all(.status.classes[]; .phase == "Ready" and .engine == "llamacpp") and
  ([.status.classes[].compileKey] | unique | length) == 2' ||
  die "GGUF class rows: $(ct | jq -c '[.status.classes[] | {class, phase, engine, compileKey, artifactDigest}]')"
for n in "$A" "$B"; do
  rowq "$n" '.phase == "Ready" and .generation.prefillSeconds > 0 and .generation.generatedTokens == 6' ||
    die "$n GGUF row: $(row "$n")"
  c=$(row "$n" | jq -r .class)
  rowq "$n" --arg d "$(crow "$c" | jq -r '.artifactDigest | sub("^sha256:"; "")')" \
    '(.artifactDigest | sub("^sha256:"; "")) == $d' || die "$n serves another artifact than its class $c's: $(row "$n")"
done
echo "   each node serves its class's Q8_0 artifact: $(row "$A" | jq -c .generation)"
