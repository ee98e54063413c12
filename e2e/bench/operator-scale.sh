#!/usr/bin/env bash
# Benchmark (not a test): kiln-operator against a control-plane-only cluster with N
# CompiledTargets over M fake node classes and --max-concurrent-compiles L. Reports the time until
# every target has M class rows, each Compiling (its Job created) or Queued (the compile slots
# full), with min(L, N*M) Jobs; the API writes of the operator's kinds during one minute of steady
# state (want 0); and the operator's peak RSS. No kubelet or controller-manager: Jobs are created,
# never run, so L of them hold the slots for good.
#
#   e2e/cluster up --control-plane-only
#   e2e/cluster run -- e2e/bench/operator-scale.sh [N] [M] [L]  # defaults 1000 10 4 (L: the
#                                                               # operator's default; N*M: no queue)
#
# KILN_BENCH_STORE=oci: the store is a real registry (/usr/bin/docker-registry, its access log
# counting every request) instead of a directory, and the bench also reports registry requests
# per full pass (requests / (reconciles / N)) over the steady minute: after, with the operator's
# lookup cache as shipped; before, a second operator on the same objects with
# --store-miss-recheck-seconds 0 (every key looked up on every reconcile, as before the cache:
# no Job runs here, so every key is a miss). Both figures and their ratio are printed.
#
# Needs target/release/kiln-operator (or debug). Leaves its namespace and nodes for inspection;
# `e2e/cluster down` removes everything.
set -euo pipefail
N=${1:-1000}
M=${2:-10}
L=${3:-4}
REPO=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
OP=$REPO/target/release/kiln-operator
[[ -x $OP ]] || OP=$REPO/target/debug/kiln-operator
WORK=$(mktemp -d /tmp/kiln-bench.XXXXXX)
NS=bench
kubectl apply -f "$REPO/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace "$NS" >/dev/null 2>&1 || true

echo "== $M fake nodes, one class each (every class key a label: no agent reports here)"
for ((i = 0; i < M; i++)); do
  cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: bench-gpu-$i
  labels: {kubernetes.io/arch: amd64, kiln.dev/cpu-level: x86-64-v3, nvidia.com/gpu.product: BENCH-GPU-$i, nvidia.com/gpu.compute.major: "9", nvidia.com/gpu.compute.minor: "0", nvidia.com/cuda.driver-version.major: "550"}
YAML
done | kubectl apply -f - >/dev/null

echo "== $N CompiledTargets"
{
  # The example's ModelArtifact only (its first document).
  awk '/^---/ {exit} /^apiVersion/ {on = 1} on' "$REPO/examples/squeezenet/kiln.yaml"
  for ((i = 0; i < N; i++)); do
    cat <<YAML
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: t-$i}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: b, dims: {batch: $((i % 8 + 1))}}]
  warmup: {fixtureVersion: v1}
  compile: {activeDeadlineSeconds: $((600 + i))}
YAML
  done
} >"$WORK/objects.yaml"
t0=$(date +%s.%N)
kubectl -n "$NS" apply -f "$WORK/objects.yaml" --server-side >/dev/null
t_targets=$(echo "$(date +%s.%N) - $t0" | bc)
echo "   applied in $t_targets s"

writes() {
  # Mutating requests on the kinds the operator writes, as the apiserver counts them.
  kubectl get --raw /metrics | awk '
    /^apiserver_request_total\{/ && /verb="(POST|PUT|PATCH|DELETE|APPLY)"/ &&
    /resource="(jobs|nodes|compiledtargets|modelartifacts|events)"/ { s += $NF }
    END { printf "%d\n", s }'
}

STORE_ARGS=(--store "$WORK/store")
REG_PID=
if [[ ${KILN_BENCH_STORE:-fs} == oci ]]; then
  echo "== registry (access log counts requests)"
  RPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$WORK/registry.yml" <<YAML
version: 0.1
log:
  level: error
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $WORK/registry
http:
  addr: 127.0.0.1:$RPORT
  secret: kiln-bench
YAML
  /usr/bin/docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
  REG_PID=$!
  for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$RPORT/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
  STORE_ARGS=(--store "oci://127.0.0.1:$RPORT/bench" --registry-insecure)
fi
# Requests the registry has answered so far (its access log, one line per request).
requests() { grep -cE '"(GET|HEAD|PUT|POST|PATCH|DELETE) /v2/' "$WORK/registry.log" || true; }
reconciles() {
  curl -fsS "http://127.0.0.1:$1/metrics" | awk '/^kiln_operator_reconcile_duration_seconds_count/ {print $2 + 0}'
}
# Requests per full pass over the next 60 s, from the operator listening on port $1.
per_pass() {
  local q1 c1 q2 c2
  q1=$(requests); c1=$(reconciles "$1")
  sleep 60
  q2=$(requests); c2=$(reconciles "$1")
  echo "$q1 $c1 $q2 $c2" | awk -v n="$N" '{ passes = ($4 - $2) / n; per = 0
    if (passes > 0) per = ($3 - $1) / passes
    printf "%d requests over %d reconciles (%.2f full passes): %.0f requests per full pass\n",
      $3 - $1, $4 - $2, passes, per }'
}

echo "== operator"
mkdir -p "$WORK/store/artifacts"
start=$(date +%s.%N)
q_start=$(requests)
${KILN_BENCH_WRAP:-} "$OP" "${STORE_ARGS[@]}" --no-leader-election --listen 127.0.0.1:18090 --log-format json \
  --agent-image kiln-e2e/agent:bench --max-concurrent-compiles "$L" >"$WORK/operator.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; [[ -z $REG_PID ]] || kill $REG_PID 2>/dev/null || true' EXIT
# The operator itself, also under a wrapper (KILN_BENCH_WRAP=heaptrack: where memory goes).
sleep 0.5
OPPID=$(pgrep -n -f -- "--listen 127.0.0.1:18090 " || echo $PID)
cpu() { awk '{printf "%.1f", ($14 + $15) / 100}' /proc/$OPPID/stat; }
# Counted from the raw list: `kubectl get -o json` spent 2 s of this 2-core machine's CPU per
# poll re-encoding 1,000 targets, beside the operator it measures, and overshot by up to a poll.
done_count() {
  kubectl get --raw "/apis/kiln.dev/v1alpha1/namespaces/$NS/compiledtargets" |
    jq --argjson m "$M" '[.items[] | select(.status.classCount == $m and ([.status.classes[]? | select(.phase == "Compiling" or .phase == "Queued")] | length) == $m)] | length'
}
want_jobs=$((N * M < L ? N * M : L))
while :; do
  c=$(done_count)
  [[ $c -ge $N && $(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l) -ge $want_jobs ]] && break
  kill -0 $PID || { tail "$WORK/operator.log"; exit 1; }
  sleep 0.5
done
end=$(date +%s.%N)
jobs=$(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l)
t_operator=$(echo "$end - $start" | bc)
printf 'reconciled all: %.1f s for %d targets x %d classes at limit %d (%d Jobs, want %d); operator CPU %s s\n' \
  "$t_operator" "$N" "$M" "$L" "$jobs" "$want_jobs" "$(cpu)"
[[ -z $REG_PID ]] || echo "registry requests until all were reconciled: $(($(requests) - q_start))"
sleep 15 # let the last status writes and Events land
w1=$(writes); o1=$(curl -fsS http://127.0.0.1:18090/metrics | awk '/^kiln_operator_api_writes_total/ {s += $2} END {print s + 0}')
if [[ -n $REG_PID ]]; then
  AFTER=$(per_pass 18090)
else
  sleep 60
fi
w2=$(writes); o2=$(curl -fsS http://127.0.0.1:18090/metrics | awk '/^kiln_operator_api_writes_total/ {s += $2} END {print s + 0}')
echo "steady state over 60 s: apiserver writes on jobs/nodes/compiledtargets/modelartifacts/events: $((w2 - w1)); operator's own write counter: $((o2 - o1))"
echo "Jobs after the minute: $(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l)"
echo "Job creates answered AlreadyExists (a Job posted again): $(kubectl get --raw /metrics | awk '
  /^apiserver_request_total\{/ && /verb="POST"/ && /resource="jobs"/ && /code="409"/ { s += $NF }
  END { printf "%d\n", s }')"
echo "operator peak RSS: $(awk '/VmHWM/ {print $2 " " $3}' /proc/$OPPID/status), now $(awk '/VmRSS/ {print $2 " " $3}' /proc/$OPPID/status); CPU $(cpu) s"
curl -fsS http://127.0.0.1:18090/metrics | grep -E '^kiln_operator_(reconcile_duration_seconds_(sum|count)|api_writes_total|classes)' || true
kill $OPPID $PID 2>/dev/null || true
wait $PID 2>/dev/null || true

if [[ -n $REG_PID ]]; then
  echo "== registry requests per full pass at $N x $M, before (no miss cache) and after"
  "$OP" "${STORE_ARGS[@]}" --no-leader-election --listen 127.0.0.1:18091 --log-format json \
    --agent-image kiln-e2e/agent:bench --max-concurrent-compiles "$L" --store-miss-recheck-seconds 0 \
    >"$WORK/operator-before.log" 2>&1 &
  BPID=$!
  sleep 45 # its first pass over every target, then steady
  BEFORE=$(per_pass 18091)
  kill $BPID 2>/dev/null || true
  wait $BPID 2>/dev/null || true
  echo "before: $BEFORE"
  echo "after:  $AFTER"
  b=$(awk '{print $(NF - 4)}' <<<"$BEFORE"); a=$(awk '{print $(NF - 4)}' <<<"$AFTER")
  awk -v b="$b" -v a="$a" 'BEGIN { if (a + 0 > 0) printf "before / after = %.0f\n", b / a
    else printf "before / after: %d / 0 (no request in the steady minute)\n", b }'
fi

# Bound, measured here: one kubectl writing what the operator had to write, the N targets' worth
# of objects (their apply above, as the N status writes) and the same number of Jobs (copies of
# one the operator made, unowned and unlabelled, in another namespace). Events are left out, so
# this is a lower bound.
echo "== bound: kubectl writes the same objects"
kubectl create namespace bench-bound >/dev/null 2>&1 || true
kubectl -n "$NS" get jobs -o json | jq -c '.items[0]
  | {apiVersion: "batch/v1", kind: "Job", metadata: {name: .metadata.name},
     spec: (.spec | del(.selector) | .template.metadata.labels = {})}' >"$WORK/job.json"
jq -c --argjson n "$jobs" '{apiVersion: "v1", kind: "List",
  items: [. as $job | range(0; $n) | . as $i | $job | .metadata.name = "bound-\($i)"]}' "$WORK/job.json" >"$WORK/jobs.json"
t0=$(date +%s.%N)
kubectl -n bench-bound apply --server-side -f "$WORK/jobs.json" >/dev/null
t_jobs=$(echo "$(date +%s.%N) - $t0" | bc)
printf 'bound: %.1f s (%.1f s for %d targets + %.1f s for %d Jobs); operator / bound = %.1f\n' \
  "$(echo "$t_targets + $t_jobs" | bc)" "$t_targets" "$N" "$t_jobs" "$jobs" \
  "$(echo "$t_operator / ($t_targets + $t_jobs)" | bc -l)"
