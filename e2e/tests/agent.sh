#!/usr/bin/env bash
# kiln-agent run against the real cluster: the agent runs as a process on the host for the real
# node, with the token of its ServiceAccount (the chart's RBAC,
# charts/kiln/templates/agent-rbac.yaml rendered for a release kiln in kiln-system, so missing
# RBAC fails the test), a filesystem store holding a real artifact compiled here by
# `kiln-agent local` from the SqueezeNet example, and a fresh node cache. No operator runs: the
# test writes the CompiledTargets' status itself (`kubectl patch --subresource=status`), as the
# operator would.
# Asserts: KilnNode created with hardware; the target row reaches Ready with the digest; a pod
# with the kiln.dev/warm readiness gate turns warm only after the row is Ready (timestamps);
# PreviousKnownGood keeps serving revision 1 when revision 2 fails parity; a restarted agent
# re-verifies its cache instead of pulling again; a corrupt stored artifact on a fresh cache is
# HashMismatch, fail-closed, gate False, counted, nothing loaded; SIGTERM exits cleanly.
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$E2E_DIR/.." && pwd)
test_namespace
NS=$TEST_NS
WORK=$(mktemp -d /var/tmp/kiln-e2e-agent.XXXXXX)
chmod 755 "$WORK"
AGENT_PID=
REAL=$(kubectl get nodes -l '!nvidia.com/gpu.product' -o jsonpath='{.items[0].metadata.name}')
cleanup() {
  [[ -n $AGENT_PID ]] && kill "$AGENT_PID" 2>/dev/null
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  # The rows name this test's targets; the next agent on the node writes its own KilnNode.
  kubectl delete kilnnode "$REAL" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  # Cluster-scoped, so a later `helm install kiln` (the README's, in the kiln test) could not own them.
  kubectl delete clusterrolebinding/kiln-agent clusterrole/kiln-agent --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
exec 3>&2
show_logs() {
  tail -n 30 "$WORK"/agent-*.log >&2 || true
  kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq '.status.targets' >&2 || true
  dump "$NS" >&2
}
die() { show_logs 2>&3; echo "FAIL: $*" >&3; exit 1; }
# A private copy: another build may replace target/*/kiln-agent while the test runs.
cp "$(bin kiln-agent)" "$WORK/kiln-agent"
AGENT=$WORK/kiln-agent
"$AGENT" run --help | grep -c -- --node-name >/dev/null || fail "$AGENT has no 'run' subcommand; rebuild"

echo "== a real artifact in a filesystem store, compiled here by kiln-agent local"
mkdir -p "$WORK/sources" "$WORK/store" "$WORK/cache"
cp "$REPO/examples/squeezenet/"{model.onnx,fixture-v1.safetensors,kiln.yaml} "$WORK/sources/"
sed -i 's/iterations: 20/iterations: 5/' "$WORK/sources/kiln.yaml"
"$AGENT" local "$WORK/sources/kiln.yaml" --store "$WORK/store" --output json >"$WORK/local.json" 2>"$WORK/local.log" ||
  { tail "$WORK/local.log"; fail "kiln-agent local: $(tail -1 "$WORK/local.json")"; }
CLASS=$(jq -r .class "$WORK/local.json")
KEY=$(jq -r .compileKey "$WORK/local.json")
DIGEST=$(jq -r .artifactDigest "$WORK/local.json")
# What the operator records for a filesystem store: the stored manifest's digest, pulled by.
MDIGEST=sha256:$(sha256sum "$WORK/store/artifacts/$KEY/manifest.json" | cut -d' ' -f1)
echo "   class $CLASS, key ${KEY:0:16}…, sha256:${DIGEST:0:16}…"

# Fixture v2: the same inputs with one golden output moved far out of tolerance.
"$AGENT" fixtures --model "$WORK/sources/model.onnx" --fixture-version v2 --shape data_0=1,3,224,224 \
  -o "$WORK/sources/fixture-v2.safetensors" >/dev/null
python3 - "$WORK/sources/fixture-v2.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
start, _ = json.loads(b[8:8 + n])['output/softmaxout_1']['data_offsets']
at = 8 + n + start
b[at:at + 4] = struct.pack('<f', struct.unpack('<f', b[at:at + 4])[0] + 0.5)
open(p, 'wb').write(b)
PY
V2_SHA=$(sha256sum "$WORK/sources/fixture-v2.safetensors" | cut -d' ' -f1)

kubectl apply -f "$REPO/charts/kiln/files/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace kiln-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
helm template kiln "$REPO/charts/kiln" -n kiln-system --set store.url=/unused \
  --show-only templates/agent-rbac.yaml | kubectl apply -f - >/dev/null
kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null
sa_kubeconfig kiln-system kiln-agent "$WORK"

RUN=0
start_agent() {
  RUN=$((RUN + 1))
  KUBECONFIG=$WORK/kubeconfig NODE_NAME=$REAL "$AGENT" run --cache "$WORK/cache" --store "file://$WORK/store" \
    --source-base "$WORK/sources" --listen 127.0.0.1:18090 --retry-seconds 5 --resync-seconds 5 \
    >>"$WORK/agent-$RUN.log" 2>&1 &
  AGENT_PID=$!
  wait_for "agent /readyz" 60 curl -fsS http://127.0.0.1:18090/readyz
}
stop_agent() {
  kill -TERM "$AGENT_PID"
  local rc=0
  wait "$AGENT_PID" || rc=$?
  AGENT_PID=
  [[ $rc == 0 ]] || die "agent exited $rc on SIGTERM"
}
metric() { curl -fsS http://127.0.0.1:18090/metrics | awk -v m="$1" '$1 == m {print $2; f=1} END {if (!f) print 0}'; }
row() { kubectl get kilnnode "$REAL" -o json | jq -r --arg ns "$NS" --arg t "$1" ".status.targets[]? | select(.namespace == \$ns and .name == \$t) | $2"; }
row_is() { [[ $(row "$1" "$2") == "$3" ]]; }
warm() { kubectl -n "$NS" get pod "$1" -o jsonpath="{.status.conditions[?(@.type==\"kiln.dev/warm\")].$2}"; }
warm_is() { [[ $(warm "$1" status) == "$2" && $(warm "$1" reason) == "$3" ]]; }
pod_ready() { [[ $(kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == "$2" ]]; }
now() { date +%s.%N; }

echo "== the agent creates its KilnNode with the probed hardware"
start_agent
kubectl get kilnnode "$REAL" --show-managed-fields -o json >"$WORK/kn.json"
jq -e '.status.hardware | (.cpuLevel | length > 0) and .cores > 0 and .memoryBytes > 0 and .runtimes.tract' "$WORK/kn.json" >/dev/null ||
  die "KilnNode hardware: $(jq -c .status.hardware "$WORK/kn.json")"
jq -e '.metadata.managedFields[] | select(.manager == "kiln-agent" and .subresource == "status")' "$WORK/kn.json" >/dev/null ||
  die "status not written by field manager kiln-agent"
echo "   $(jq -c '.status.hardware | {arch, cpuLevel, cores}' "$WORK/kn.json")"

ensure_busybox
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: squeezenet}
spec:
  source: {uri: "file://model.onnx", sha256: ed2b431ab1bf5eac85c1416e07cbf8e6d86f051c1a6684d9e2516838528cf976, size: 15628}
  format: onnx
  inputs: [{name: data_0, dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 3}, {size: 224}, {size: 224}]}]
  fixtures:
    - {version: v1, uri: "file://fixture-v1.safetensors", sha256: 6aed221b6d20f3975a4e8586c4139261d6805ce18f37a807447e44883115a958}
    - {version: v2, uri: "file://fixture-v2.safetensors", sha256: $V2_SHA}
YAML
# target NAME POLICY: the example's target (same spec as the local compile) with a fallback policy.
target() {
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  precision: fp32
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {iterations: 5, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}
  fallback: {policy: $2}
  rollout: {knownGoodHistory: 2}
YAML
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: server-$1
  annotations: {kiln.dev/target: $1}
spec:
  readinessGates: [{conditionType: kiln.dev/warm}]
  containers: [{name: c, image: $BUSYBOX_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}]
YAML
}
# revisions NAME N: the target's status names revisions 1..N, each with the stored artifact.
revisions() {
  local revs
  revs=$(jq -nc --argjson n "$2" --arg c "$CLASS" --arg k "$KEY" --arg d "$DIGEST" --arg m "$MDIGEST" \
    '[range(1; $n + 1) | {number: ., generation: ., artifacts: [{class: $c, compileKey: $k, digest: $d, manifestDigest: $m}]}]')
  kubectl -n "$NS" patch compiledtarget "$1" --subresource=status --type=merge -p "$(jq -nc \
    --argjson n "$2" --arg c "$CLASS" --arg k "$KEY" --arg d "$DIGEST" --arg m "$MDIGEST" --argjson revs "$revs" \
    '{status: {revision: $n, classes: [{class: $c, compileKey: $k, artifactDigest: $d, manifestDigest: $m, phase: "Compiled"}], revisions: $revs}}')" >/dev/null
}

echo "== FailClosed target: Pending until it has a revision; gate False, pod not Ready"
target sq FailClosed
running() { [[ $(kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
wait_for "pod server-sq running" 60 running server-sq
wait_for "row sq Pending" 30 row_is sq .phase Pending
wait_for "gate False/Pending on server-sq" 30 warm_is server-sq False Pending
pod_ready server-sq False || die "server-sq Ready before its target is"

echo "== revision 1: pulled, verified, loaded, warmed, Ready; only then is the pod warm"
t0=$(now)
revisions sq 1
wait_for "row sq Ready" 120 row_is sq .phase Ready
t_ready=$(now)
wait_for "gate True on server-sq" 30 warm_is server-sq True Ready
wait_for "pod server-sq Ready" 30 pod_ready server-sq True
[[ $(row sq .artifactDigest) == "$DIGEST" && $(row sq .revision) == 1 && $(row sq .class) == "$CLASS" ]] ||
  die "row: $(row sq .)"
ready_since=$(row sq .readySince)
seen_at=$(row sq .revisionSeenAt)
warm_at=$(warm server-sq lastTransitionTime)
[[ -n $ready_since && ! $warm_at < $ready_since ]] || die "pod warm at $warm_at, before the row was Ready at $ready_since"
# Sub-second order from the agent's own JSON log: the row went Ready before the gate went True.
t_row=$(jq -r --arg t "$NS/sq" 'select(.fields.message == "ready" and .fields.target == $t) | .timestamp' "$WORK/agent-1.log" | head -1)
t_gate=$(jq -r --arg p "$NS/server-sq" 'select(.fields.message == "set kiln.dev/warm" and .fields.pod == $p and .fields.status == true) | .timestamp' "$WORK/agent-1.log" | head -1)
[[ -n $t_row && -n $t_gate && $t_row < $t_gate ]] || die "gate True at ${t_gate:-never}, row Ready at ${t_row:-never}"
echo "   row Ready $t_row < gate True $t_gate"
(($(row sq .pullBytes) > 0)) || die "no bytes pulled: $(row sq .)"
[[ -d $WORK/cache/artifacts/$DIGEST && -z $(ls -A "$WORK/cache/tmp") ]] || die "cache layout"
printf '   revision patched -> row Ready: %.2f s (revisionSeenAt %s, readySince %s; pod warm %s)\n' \
  "$(awk -v a="$t0" -v b="$t_ready" 'BEGIN {print b - a}')" "$seen_at" "$ready_since" "$warm_at"
echo "   $(row sq '{pullBytes, pullSeconds, loadSeconds, warmupSeconds, parityMaxAbsError}' | jq -c .)"
[[ $(metric "kiln_agent_target_ready{namespace=\"$NS\",target=\"sq\",class=\"$CLASS\"}") == 1 ]] || die "target_ready metric"
(($(metric kiln_agent_revision_ready_seconds_count) >= 1)) || die "revision_ready_seconds not observed"

echo "== PreviousKnownGood: revision 2 fails parity, the node keeps serving revision 1"
target pkg PreviousKnownGood
revisions pkg 1
wait_for "row pkg Ready" 120 row_is pkg .phase Ready
wait_for "gate True on server-pkg" 30 warm_is server-pkg True Ready
pkg_warm_at=$(warm server-pkg lastTransitionTime)
# The kubelet turns the pod Ready a moment after the gate; from then on it must stay Ready.
wait_for "pod server-pkg Ready" 30 pod_ready server-pkg True
ready_at() { kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}'; }
pkg_ready_at=$(ready_at server-pkg)
kubectl -n "$NS" patch compiledtarget pkg --type=merge -p '{"spec":{"warmup":{"fixtureVersion":"v2"}}}' >/dev/null
revisions pkg 2
degraded_for_2() { row_is pkg .phase Degraded && row_is pkg .desiredRevision 2; }
wait_for "row pkg Degraded, wanting revision 2" 120 degraded_for_2
[[ $(row pkg .revision) == 1 && $(row pkg .desiredRevision) == 2 && $(row pkg .reason) == ParityExceeded &&
   $(row pkg .fallback) == PreviousKnownGood ]] || die "pkg row: $(row pkg . | jq -c .)"
warm_is server-pkg True Degraded || die "pkg gate: $(warm server-pkg status) $(warm server-pkg reason)"
[[ $(warm server-pkg lastTransitionTime) == "$pkg_warm_at" ]] || die "pkg gate flapped"
pod_ready server-pkg True && [[ $(ready_at server-pkg) == "$pkg_ready_at" ]] ||
  die "server-pkg not Ready on the fallback, or its readiness flapped"
(($(metric 'kiln_agent_fallbacks_total{reason="ParityExceeded",policy="PreviousKnownGood"}') >= 1)) || die "fallback not counted"
echo "   $(row pkg .message | cut -c1-160)…"
curl -fsS http://127.0.0.1:18090/metrics >"$WORK/metrics-1.txt"

echo "== restart (SIGTERM): the cache is re-verified, not pulled again; nothing flaps"
stop_agent
start_agent
wait_for "row sq re-verified from the cache" 60 row_is sq .pullBytes 0
row_is sq .phase Ready || die "sq after restart: $(row sq . | jq -c .)"
[[ $(row sq .readySince) == "$ready_since" ]] || die "readySince changed across restart"
wait_for "pkg Degraded again" 60 degraded_for_2
[[ $(metric kiln_agent_artifact_pull_bytes_total) == 0 ]] || die "restarted agent pulled again"
warm_is server-sq True Ready || die "server-sq gate after restart"

echo "== a corrupt stored artifact on a fresh node cache: HashMismatch, fail closed, nothing loaded"
stop_agent
rm -rf "$WORK/cache"
python3 - "$WORK/store/artifacts/$KEY/artifact" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[len(b) // 2] ^= 0x01
open(p, 'wb').write(b)
PY
start_agent
wait_for "row sq Failed" 60 row_is sq .phase Failed
[[ $(row sq .reason) == HashMismatch && $(row sq .fallback) == FailClosed ]] || die "sq row: $(row sq . | jq -c .)"
wait_for "gate False/HashMismatch on server-sq" 30 warm_is server-sq False HashMismatch
wait_for "pod server-sq not Ready" 30 pod_ready server-sq False
curl -fsS http://127.0.0.1:18090/metrics >"$WORK/metrics-2.txt"
(($(metric 'kiln_agent_verify_failures_total{reason="HashMismatch"}') >= 1)) || die "verification failure not counted"
(($(metric 'kiln_agent_fail_closed_total{reason="HashMismatch"}') >= 1)) || die "fail-closed not counted"
[[ $(metric "kiln_agent_target_ready{namespace=\"$NS\",target=\"sq\",class=\"$CLASS\"}") == 0 ]] || die "target_ready still 1"
[[ $(metric 'kiln_agent_load_seconds_count{class="'"$CLASS"'"}') == 0 ]] || die "something was loaded"
[[ -z $(ls -A "$WORK/cache/artifacts") && -z $(ls -A "$WORK/cache/tmp") ]] || die "a corrupt or partial artifact is in the cache"
echo "   $(row sq .message | cut -c1-160)…"
stop_agent
grep -q '"level":"INFO"' "$WORK/agent-1.log" || die "logs are not JSON"

echo "== metrics show the path"
for f in metrics-1 metrics-2; do
  if [[ $f == metrics-1 ]]; then echo "   first run (Ready, PreviousKnownGood):"; else echo "   after the corruption (fresh cache):"; fi
  grep -E '^kiln_agent_(artifact_pull_bytes_total|artifact_pull_seconds_count|load_seconds_count|warmup_seconds_count|fixture_latency_seconds_count|parity_max_abs_error|target_ready|revision_ready_seconds_(sum|count)|fallbacks_total|verify_failures_total\{reason="HashMismatch"|fail_closed_total\{reason="HashMismatch")' \
    "$WORK/$f.txt" | sed 's/^/     /'
done
