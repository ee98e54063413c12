#!/usr/bin/env bash
# kiln-operator against the real cluster (set-up in operator-lib.sh): the real node plus two fake
# GPU nodes (H100, L4) form three classes; the fake nodes carry every class key as a label and
# classify at once, the real node only once its hardware is reported (KilnNode); the real node's
# compile Job runs the real `kiln-agent compile`; Jobs, status, restarts, two replicas, bad input,
# deletion, metrics.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/observe-lib.sh"
source "$(dirname "$0")/operator-lib.sh"
# shellcheck disable=SC2034 # read by cleanup (operator-lib.sh)
CLEANUP_NODES=("fake-h100-$NS" "fake-l4-$NS")

# The operator image, built the same way, runs in the cluster (the in-cluster Deployment comes
# with the Helm chart; here the process on the host is the one under test).
kiln_image kiln-operator kiln-e2e/operator:test "$WORK"
kubectl -n "$NS" run operator-image --image=kiln-e2e/operator:test --image-pull-policy=Never \
  --restart=Never --command -- /bin/kiln-operator --version >/dev/null
kubectl -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/operator-image --timeout=60s >/dev/null ||
  fail "operator image did not run: $(kubectl -n "$NS" describe pod operator-image | tail -20)"
kubectl -n "$NS" logs operator-image | grep -c '^kiln-operator ' >/dev/null || fail "operator image printed no version"
echo "operator image built by build-image runs in the cluster: $(kubectl -n "$NS" logs operator-image)"

# Two fake GPU nodes (they run nothing; their Jobs stay pending, hence --max-concurrent-compiles
# 20), labelled with every default class key, as GPU Feature Discovery plus an administrator's
# CPU level would: no agent report needed to classify them.
for spec in "h100 NVIDIA-H100-80GB-HBM3-MIG-1g.10gb 9 0" "l4 NVIDIA-L4 8 9"; do
  read -r short product major minor <<<"$spec"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: fake-$short-$NS
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kiln.dev/cpu-level: x86-64-v3
    nvidia.com/gpu.product: $product
    nvidia.com/gpu.compute.major: "$major"
    nvidia.com/gpu.compute.minor: "$minor"
    nvidia.com/cuda.driver-version.major: "550"
YAML
done
# The real node as if its agent had not reported (its class label from earlier tests stays: the
# operator must take it off, the class being unknown).
kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null

start_operator 1
wait_for "operator /readyz" 60 curl -fsS http://127.0.0.1:18081/readyz
# Absences below are watches of the namespace's Jobs from a resourceVersion: every Job created
# since then is seen. ADDED_BY matches a Job created for the target $t.
JOBS=/apis/batch/v1/namespaces/$NS/jobs
# shellcheck disable=SC2016 # $t is jq's
ADDED_BY='.type == "ADDED" and .object.metadata.ownerReferences[0].name == $t'

echo "== the example: the labelled GPU classes compile; the real node waits for its hardware report"
kubectl -n "$NS" apply -f "$REPO/examples/squeezenet/kiln.yaml" >/dev/null
wait_for "2 compile Jobs" 60 count_is squeezenet-cpu 2
collection_rv rv "$JOBS"
count_is squeezenet-cpu 2 || die "$(jobs_of squeezenet-cpu) Jobs before $REAL reported its hardware"
assert_no_events_since "$JOBS" "$rv" 2 "Jobs created before $REAL reported its hardware" "$ADDED_BY" --arg t squeezenet-cpu
[[ -z $(kubectl get node "$REAL" -o jsonpath='{.metadata.labels.kiln\.dev/class}') ]] ||
  die "$REAL keeps a class label while its hardware is unknown"
msg=$(cond squeezenet-cpu Ready message)
[[ $msg == *"($REAL) have no class yet"*kiln.dev/cpu-level* ]] || die "Ready message: $msg"
echo "   $msg"
report_hardware "$REAL"
echo "== once reported: one Job per class, pinned by the class label"
wait_for "3 compile Jobs" 60 count_is squeezenet-cpu 3
for node in "$REAL" "fake-h100-$NS" "fake-l4-$NS"; do
  wait_for "class label on $node" 30 kubectl get node "$node" -o jsonpath='{.metadata.labels.kiln\.dev/class}'
  class=$(kubectl get node "$node" -o jsonpath='{.metadata.labels.kiln\.dev/class}')
  [[ -n $class ]] || die "node $node has no kiln.dev/class label"
  n=$(kubectl -n "$NS" get jobs -o json | jq --arg c "$class" '[.items[] | select(.spec.template.spec.nodeSelector["kiln.dev/class"] == $c)] | length')
  [[ $n == 1 ]] || die "class $class of $node: $n Jobs, want 1"
  echo "   $node -> class $class, 1 Job"
done
REAL_CLASS=$(kubectl get node "$REAL" -o jsonpath='{.metadata.labels.kiln\.dev/class}')
[[ $(kubectl get node "fake-h100-$NS" -o jsonpath='{.metadata.labels.kiln\.dev/class}') == nvidia-h100-80gb-hbm3-sm90-drv550-amd64-* ]] ||
  die "MIG suffix split the H100 class"

echo "== the real node's Job runs kiln-agent compile; the target records the artifact digest"
digest_of() { kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json | jq -r --arg c "$REAL_CLASS" '.status.classes[] | select(.class == $c) | .artifactDigest // empty'; }
has_digest() {
  [[ $(cond squeezenet-cpu Stalled status) != True ]] || die "Stalled: $(cond squeezenet-cpu Stalled message)"
  [[ -n $(digest_of) ]]
}
wait_for "artifact digest for $REAL_CLASS" 240 has_digest
DIGEST=$(digest_of)
KEY=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json | jq -r --arg c "$REAL_CLASS" '.status.classes[] | select(.class == $c) | .compileKey')
[[ -f $WORK/store/artifacts/$KEY/manifest.json ]] || die "no manifest for $KEY in the store"
[[ $(sha256sum "$WORK/store/artifacts/$KEY/artifact" | cut -d' ' -f1) == "$DIGEST" ]] || die "status digest differs from the stored artifact"
jq -e --arg d "$DIGEST" '.artifactDigest == $d and .backend == "tract"' "$WORK/store/artifacts/$KEY/manifest.json" >/dev/null || die "manifest disagrees"
echo "   $REAL_CLASS: sha256:$DIGEST"
cond_is squeezenet-cpu Reconciling True Compiling || die "want Reconciling while the GPU classes wait"
kubectl -n "$NS" get events --field-selector involvedObject.name=squeezenet-cpu -o json |
  jq -e '[.items[].reason] | index("CompileJobCreated") and index("ClassCompiled")' >/dev/null || die "missing Events"

echo "== re-apply, restart, two replicas: no duplicate Job"
collection_rv rv "$JOBS"
kubectl -n "$NS" apply -f "$REPO/examples/squeezenet/kiln.yaml" >/dev/null
assert_no_events_since "$JOBS" "$rv" 3 "Jobs created by the re-apply" "$ADDED_BY" --arg t squeezenet-cpu
count_is squeezenet-cpu 3 || die "re-apply: $(jobs_of squeezenet-cpu) Jobs"
# From before the restart to 3 s after the second target's Jobs: its 3 Jobs and no other.
collection_rv rv "$JOBS"
kill "$OP_1"; wait "$OP_1" 2>/dev/null || true
start_operator 1
start_operator 2
wait_for "replica 2 /readyz" 60 curl -fsS http://127.0.0.1:18082/readyz
holder() { kubectl -n kiln-system get lease "kiln-operator-$NS" -o jsonpath='{.spec.holderIdentity}'; }
wait_for "a lease holder" 60 holder
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: second}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: batch2, dims: {batch: 2}}]
  warmup: {fixtureVersion: v1}
  compile: {maxAttempts: 1}
YAML
wait_for "3 Jobs for the second target" 60 count_is second 3
events_since "$JOBS" "$rv" 3 "$WORK/jobs.events"
expect_count "$WORK/jobs.events" 3 "Jobs created for second by two replicas" "$ADDED_BY" --arg t second
expect_count "$WORK/jobs.events" 0 "Jobs created for squeezenet-cpu by the restart" "$ADDED_BY" --arg t squeezenet-cpu
count_is second 3 || die "two replicas: $(jobs_of second) Jobs for second"
count_is squeezenet-cpu 3 || die "restart: $(jobs_of squeezenet-cpu) Jobs"
echo "   lease held by $(holder); 3 + 3 Jobs"
kubectl -n "$NS" delete compiledtarget second --wait=false >/dev/null

echo "== the compile limit holds when many targets reconcile at once"
# Twelve targets of the GPU classes only (their Jobs never run), applied while no operator runs so
# that all reconcile together at its start. Running now: squeezenet-cpu's two GPU Jobs.
kill "$OP_1" "$OP_2"; wait "$OP_1" "$OP_2" 2>/dev/null || true
wait_for "second's Jobs gone" 60 count_is second 0
# Compile Jobs running as the operator counts them: not finished, not being deleted.
active() { kubectl -n "$NS" get jobs -l app.kubernetes.io/managed-by=kiln-operator -o json | jq '[.items[] | select(.metadata.deletionTimestamp == null) | select([.status.conditions[]? | select((.type == "Complete" or .type == "Failed") and .status == "True")] | length == 0)] | length'; }
[[ $(active) == 2 ]] || die "running compile Jobs before the limit test: $(active), want 2"
for i in $(seq 1 12); do
  cat <<YAML
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: q-$i}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: b, dims: {batch: $((i % 7 + 2))}}]
  nodeSelector: {matchExpressions: [{key: nvidia.com/gpu.product, operator: Exists}]}
  warmup: {fixtureVersion: v1}
  compile: {activeDeadlineSeconds: $((600 + i))}
YAML
done | kubectl -n "$NS" apply -f - >/dev/null
collection_rv rv "$JOBS"
LIMIT=5 start_operator 1
rows() { kubectl -n "$NS" get compiledtargets -o json | jq -r '[.items[] | select(.metadata.name | startswith("q-")) | .status.classes[]?.phase] | group_by(.) | map("\(.[0])=\(length)") | join(" ")'; }
q_rows() { kubectl -n "$NS" get compiledtargets -o json | jq '[.items[] | select(.metadata.name | startswith("q-")) | .status.classes[]?] | length'; }
q_rows_are() { [[ $(q_rows) == "$1" ]]; }
wait_for "24 class rows of the 12 targets" 60 q_rows_are 24
# Every Job created from the operator's start to 3 s after the rows: 3, so never over the limit.
events_since "$JOBS" "$rv" 3 "$WORK/jobs.events"
expect_count "$WORK/jobs.events" 3 "Jobs created at limit 5 with 2 running" '.type == "ADDED"'
[[ $(rows) == "Compiling=3 Queued=21" ]] || die "limit 5 with 2 running: rows $(rows), want Compiling=3 Queued=21"
[[ $(active) == 5 ]] || die "limit 5: $(active) compile Jobs running"
msg=$(kubectl -n "$NS" get compiledtargets -o json | jq -r '[.items[].status.classes[]? | select(.phase == "Queued") | .message][0]')
[[ $msg == *"all 5 concurrent compiles"*--max-concurrent-compiles* ]] || die "Queued row message: $msg"
echo "   12 targets x 2 classes at limit 5: $(rows), $(active) Jobs running; \"$msg\""
kubectl -n "$NS" delete compiledtargets $(printf 'q-%s ' $(seq 1 12)) --wait=false >/dev/null
kill "$OP_1"; wait "$OP_1" 2>/dev/null || true
start_operator 1
start_operator 2

echo "== without the GPU nodes, the target is one class, compiled: revision 1; not Ready until nodes report"
kubectl delete node "fake-h100-$NS" "fake-l4-$NS" >/dev/null
wait_for "Compiled=True" 60 cond_is squeezenet-cpu Compiled True Compiled
wait_for "Ready=False WaitingForNodes" 30 cond_is squeezenet-cpu Ready False WaitingForNodes
rev=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json | jq -r '.status.revisions[-1] | "\(.number) \(.artifacts[0].digest)"')
[[ $rev == "1 $DIGEST" ]] || die "revision: $rev"
wait_for "the GPU classes' Jobs deleted" 60 count_is squeezenet-cpu 1
kubectl -n "$NS" get compiledtarget squeezenet-cpu

echo "== steady state: no writes"
no_writes_for 10 "at steady state" 1 2

echo "== a failing compile is classified, retried, then Stalled"
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: corrupt}
spec:
  source: {uri: "file://model.onnx", sha256: "0000000000000000000000000000000000000000000000000000000000000000", size: 15628}
  format: onnx
  inputs: [{name: data_0, dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 3}, {size: 224}, {size: 224}]}]
  fixtures: [{version: v1, uri: "file://fixture-v1.safetensors", sha256: "6aed221b6d20f3975a4e8586c4139261d6805ce18f37a807447e44883115a958"}]
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: corrupt}
spec:
  modelRef: {name: corrupt}
  backend: {kind: tract}
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {fixtureVersion: v1}
  compile: {maxAttempts: 2}
YAML
wait_for "corrupt Stalled" 180 cond_is corrupt Stalled True HashMismatch
msg=$(cond corrupt Stalled message)
[[ $msg == *sha256* && $msg == *"2 attempt"* ]] || die "Stalled message: $msg"
echo "   $msg"
[[ $(jobs_of corrupt) == 2 ]] || die "corrupt: $(jobs_of corrupt) Jobs, want 2 attempts"

echo "== bad input: a condition that says what to fix"
bad() {
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: ${2:-squeezenet}${3:+, namespace: $3}}
  backend: {kind: tract}
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {fixtureVersion: v1}
  ${4:-}
YAML
}
bad missing-model nope
bad other-namespace squeezenet default
bad no-nodes squeezenet "" "nodeSelector: {matchLabels: {pool: nowhere}}"
bad no-key squeezenet "" "classLabelKeys: [example.com/accelerator]"
for pair in missing-model:ModelNotFound other-namespace:ModelInOtherNamespace no-nodes:NoMatchingNodes no-key:ClassKeyNotFound; do
  wait_for "${pair%%:*} Stalled ${pair#*:}" 30 cond_is "${pair%%:*}" Stalled True "${pair#*:}"
  count_is "${pair%%:*}" 0 || die "${pair%%:*} has Jobs"
  echo "   ${pair%%:*}: $(cond "${pair%%:*}" Stalled message)"
done
if out=$(bad bad-backend squeezenet "" "" 2>&1 && kubectl -n "$NS" patch compiledtarget bad-backend --type=merge -p '{"spec":{"backend":{"kind":"bogus"}}}' 2>&1); then
  die "an unknown backend was admitted: $out"
fi
[[ $out == *Unsupported* ]] || die "unknown backend refused for another reason: $out"
no_writes_for 5 "on bad input (a hot loop)" 1 2
{ kill -0 "$OP_1" && kill -0 "$OP_2"; } || die "an operator replica died"

echo "== deleting the target removes its Jobs and keeps the stored artifact"
kubectl -n "$NS" delete compiledtarget squeezenet-cpu >/dev/null
wait_for "Jobs garbage-collected" 90 count_is squeezenet-cpu 0
[[ -f $WORK/store/artifacts/$KEY/artifact ]] || die "stored artifact removed"

echo "== metrics"
m=$(curl -fsS http://127.0.0.1:18081/metrics; curl -fsS http://127.0.0.1:18082/metrics)
for name in kiln_operator_reconcile_duration_seconds kiln_operator_compile_jobs_total kiln_operator_classes; do
  grep -q "^$name" <<<"$m" || die "no $name in /metrics"
done
grep -q 'result="failed",reason="HashMismatch"' <<<"$m" || die "failed compile not counted by reason"
grep -q '"level":"INFO"' "$WORK/operator-1.log" || die "operator logs are not JSON"
echo "operator e2e passed"
