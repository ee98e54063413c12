#!/usr/bin/env bash
# Benchmark (not a test): kiln-operator against a control-plane-only cluster with N
# CompiledTargets over M fake node classes and --max-concurrent-compiles L. Reports the time until
# every target has M class rows, each Compiling (its Job created) or Queued (the compile slots
# full), with min(L, N*M) Jobs, against the bound measured in the same run (one kubectl writing
# the same objects); the operator's peak RSS and CPU, the apiserver's and etcd's CPU, and the API
# requests by verb and resource while it reconciled; the API writes of the operator's kinds during
# one minute of steady state (want 0); and a leader change: a second replica takes the Lease from
# the first (SIGTERM) and its writes in its first minute are counted (want 0: every status is
# already right), with the time it takes to reconcile every target once. No kubelet or
# controller-manager: Jobs are created, never run, so L of them hold the slots for good. Completion
# is seen through one watch (watch-targets.py), not by listing N targets per poll: a list of
# 10,000 targets cost the apiserver and jq seconds of these two cores per poll.
#
#   e2e/cluster up --control-plane-only
#   e2e/cluster run -- e2e/bench/operator-scale.sh [N] [M] [L]  # defaults 1000 10 4 (L: the
#                                                               # operator's default; N*M: no queue)
#   e2e/bench/operator-scale.sh --curve [N,N,...] [M] [L]       # root: each N on a fresh
#       control-plane-only cluster (brought up and down here), then one table; default
#       1000,3000,10000. Take the e2e lock and the quiet lock around it:
#       flock /tmp/kiln-e2e.lock flock -x /tmp/kiln-quiet.lock e2e/bench/operator-scale.sh --curve
#
# KILN_BENCH_STORE=oci: the store is a real registry (/usr/bin/docker-registry, its access log
# counting every request) instead of a directory, and the bench also reports registry requests
# per full pass (requests / (reconciles / N)) over the steady minute: after, with the operator's
# lookup cache as shipped; before, another operator on the same objects with
# --store-miss-recheck-seconds 0 (every key looked up on every reconcile, as before the cache:
# no Job runs here, so every key is a miss). Both figures and their ratio are printed.
# KILN_BENCH_WRAP=heaptrack runs the first operator under heaptrack (where memory goes).
#
# Needs target/release/kiln-operator (or debug). Leaves its namespace and nodes for inspection;
# `e2e/cluster down` removes everything. The last line is `RESULT key=value ...` (the table's row).
set -euo pipefail
REPO=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
BENCH=$REPO/e2e/bench

if [[ ${1:-} == --curve ]]; then
  IFS=, read -r -a SIZES <<<"${2:-1000,3000,10000}"
  M=${3:-10} L=${4:-4}
  OUT=$(mktemp -d /tmp/kiln-bench-curve.XXXXXX)
  for n in "${SIZES[@]}"; do
    "$REPO/e2e/cluster" down >/dev/null 2>&1 || true
    "$REPO/e2e/cluster" up --control-plane-only >/dev/null
    echo "=== $n targets x $M classes (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$REPO/e2e/cluster" run -- "$BENCH/operator-scale.sh" "$n" "$M" "$L" 2>&1 | tee "$OUT/$n.log" || true
    "$REPO/e2e/cluster" down >/dev/null 2>&1 || true
  done
  echo
  echo "== curve ($M classes, compile limit $L; logs in $OUT)"
  printf '| %s |\n' "targets | reconcile all | bound | ratio | peak RSS | operator CPU | apiserver + etcd CPU | status writes | Events | other writes | writes 1st min after leader change | new leader reconciled all | load before/after"
  printf '|%s\n' "---|---|---|---|---|---|---|---|---|---|---|---|---|"
  per_target=() prev_n= prev_rss=
  for n in "${SIZES[@]}"; do
    line=$(grep '^RESULT ' "$OUT/$n.log" | tail -1) || { echo "| $n | (failed: $OUT/$n.log) |"; continue; }
    declare -A r=()
    for kv in ${line#RESULT }; do r[${kv%%=*}]=${kv#*=}; done
    printf '| %s | %s s | %s s | %s× | %s MiB | %s s | %s s | %s | %s | %s | %s | %s s | %s / %s |\n' \
      "${r[n]}" "${r[t]}" "${r[bound]}" "${r[ratio]}" "${r[rss]}" "${r[cpu]}" "${r[api_cpu]}" \
      "${r[status]}" "${r[events]}" "${r[other]}" "${r[restart_writes]}" "${r[restart_t]}" \
      "${r[load0]}" "${r[load1]}"
    if [[ -n $prev_n ]]; then
      per_target+=("peak RSS per added target from $prev_n to ${r[n]}: $(echo "(${r[rss]} - $prev_rss) * 1048576 / (${r[n]} - $prev_n)" | bc) bytes")
    fi
    prev_n=${r[n]} prev_rss=${r[rss]}
  done
  printf '%s\n' "${per_target[@]}"
  exit 0
fi

N=${1:-1000}
M=${2:-10}
L=${3:-4}
OP=$REPO/target/release/kiln-operator
[[ -x $OP ]] || OP=$REPO/target/debug/kiln-operator
WORK=$(mktemp -d /tmp/kiln-bench.XXXXXX)
NS=bench
STATE=${KILN_E2E_STATE:-/var/lib/kiln-e2e}
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
kubectl apply -f "$REPO/charts/kiln/files/crds/" >/dev/null
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

# Per "VERB:RESOURCE": requests (apiserver_request_total, every client's; the bench's own are a
# watch and a few gets), and the apiserver's time in them (seconds, requests timed).
requests_by() {
  kubectl get --raw /metrics | awk '
    /^apiserver_request_(total|duration_seconds_sum|duration_seconds_count)\{/ {
      v = ""; r = ""
      if (match($0, /verb="[A-Z]+"/)) v = substr($0, RSTART + 6, RLENGTH - 7)
      if (match($0, /resource="[a-z]+"/)) r = substr($0, RSTART + 10, RLENGTH - 11)
      k = v ":" r; keys[k] = 1
      if ($0 ~ /^apiserver_request_total/) n[k] += $NF
      else if ($0 ~ /_sum\{/) t[k] += $NF
      else c[k] += $NF }
    END { for (k in keys) printf "%s %d %.3f %d\n", k, n[k], t[k], c[k] }' | sort
}
# What changed between two requests_by snapshots, for the kinds that matter here: VERB RESOURCE
# requests, and the apiserver's mean time per request in ms.
requests_delta() {
  join -a 2 -e 0 -o 0,1.2,1.3,1.4,2.2,2.3,2.4 "$1" "$2" |
    awk '{ d = $5 - $2; split($1, k, ":"); ms = ($7 > $4) ? ($6 - $3) * 1000 / ($7 - $4) : 0
      if (d > 0 && k[2] ~ /^(compiledtargets|events|jobs|nodes|kilnnodes|modelartifacts|leases|pods)$/)
        printf "%s %s %d %.1f\n", k[1], k[2], d, ms }'
}
# Mutating requests on the kinds the operator writes, as the apiserver counts them.
writes() {
  kubectl get --raw /metrics | awk '
    /^apiserver_request_total\{/ && /verb="(POST|PUT|PATCH|DELETE|APPLY)"/ &&
    /resource="(jobs|nodes|compiledtargets|modelartifacts|events)"/ { s += $NF }
    END { printf "%d\n", s }'
}
pid_of() { awk '{print $1}' "$STATE/pids/$1.pid" 2>/dev/null || pgrep -n -x "$1"; }
cpu_of() { awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$1/stat"; }
API_PID=$(pid_of kube-apiserver) ETCD_PID=$(pid_of etcd)
cp_cpu() { echo "$(cpu_of "$API_PID") + $(cpu_of "$ETCD_PID")" | bc; }

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
metric() { curl -fsS "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^" m {s += $2} END {print s + 0}'; }
reconciles() { metric "$1" kiln_operator_reconcile_duration_seconds_count; }
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
# One operator replica with leader election (Lease kiln-bench in $NS), listening on port $1.
operator() {
  local port=$1 identity=$2
  shift 2
  "$OP" "${STORE_ARGS[@]}" --listen "127.0.0.1:$port" --log-format json \
    --lease-namespace "$NS" --lease-name kiln-bench --identity "$identity" \
    --agent-image kiln-e2e/agent:bench --max-concurrent-compiles "$L" "$@"
}
# The pid of the operator listening on port $1 (under a wrapper, not the wrapper's).
op_pid() { pgrep -n -f -- "--listen 127.0.0.1:$1 " || echo "$2"; }
PIDS_TO_STOP=()
trap 'for p in "${PIDS_TO_STOP[@]}"; do kill "$p" 2>/dev/null || true; done; [[ -z $REG_PID ]] || kill $REG_PID 2>/dev/null || true' EXIT

echo "== operator"
mkdir -p "$WORK/store/artifacts"
python3 "$BENCH/watch-targets.py" rows "$NS" "$N" "$M" 1800 >"$WORK/done" 2>"$WORK/watch.log" &
WATCH=$!
PIDS_TO_STOP+=("$WATCH")
sleep 1 # the watch has listed
requests_by >"$WORK/req0"
cp0=$(cp_cpu)
q_start=$(requests)
start=$(date +%s.%N)
${KILN_BENCH_WRAP:-} "$OP" "${STORE_ARGS[@]}" --listen 127.0.0.1:18090 --log-format json \
  --lease-namespace "$NS" --lease-name kiln-bench --identity first \
  --agent-image kiln-e2e/agent:bench --max-concurrent-compiles "$L" >"$WORK/operator.log" 2>&1 &
PID=$!
PIDS_TO_STOP+=("$PID")
sleep 0.5
OPPID=$(op_pid 18090 $PID)
wait "$WATCH" || { tail "$WORK/watch.log" "$WORK/operator.log"; exit 1; }
end=$(cat "$WORK/done")
cp1=$(cp_cpu)
rec_n=$(reconciles 18090) rec_s=$(metric 18090 kiln_operator_reconcile_duration_seconds_sum)
requests_by >"$WORK/req1"
want_jobs=$((N * M < L ? N * M : L))
for _ in $(seq 120); do
  (($(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l) >= want_jobs)) && break
  sleep 0.5
done
jobs=$(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l)
t_operator=$(echo "$end - $start" | bc)
cpu_done=$(cpu_of "$OPPID")
printf 'reconciled all: %.1f s for %d targets x %d classes at limit %d (%d Jobs, want %d); operator CPU %s s, apiserver + etcd CPU %s s (%s s wall x %d cores = %.1f core-s)\n' \
  "$t_operator" "$N" "$M" "$L" "$jobs" "$want_jobs" "$cpu_done" "$(echo "$cp1 - $cp0" | bc)" \
  "$t_operator" "$(nproc)" "$(echo "$t_operator * $(nproc)" | bc)"
sed 's/^/   /' "$WORK/watch.log"
printf 'reconciles: %d (%.2f per target), %.1f ms each on average; the %d reconcile slots were busy %.0f%% of the wall time\n' \
  "$rec_n" "$(echo "$rec_n / $N" | bc -l)" "$(echo "$rec_s * 1000 / ($rec_n + 0.000001)" | bc -l)" \
  "${KILN_MAX_CONCURRENT_RECONCILES:-32}" "$(echo "$rec_s * 100 / ($t_operator * ${KILN_MAX_CONCURRENT_RECONCILES:-32})" | bc -l)"
echo "API requests while it reconciled, by verb and resource (every client's), and the apiserver's mean ms per request:"
requests_delta "$WORK/req0" "$WORK/req1" | tee "$WORK/reqd" | sed 's/^/   /'
status_w=$(awk '$2 == "compiledtargets" && $1 ~ /PATCH|APPLY|PUT/ {s += $3} END {print s + 0}' "$WORK/reqd")
event_w=$(awk '$2 == "events" && $1 ~ /POST|PATCH/ {s += $3} END {print s + 0}' "$WORK/reqd")
other_w=$(awk '$2 ~ /^(jobs|nodes)$/ && $1 ~ /POST|PATCH|PUT|DELETE|APPLY/ {s += $3} END {print s + 0}' "$WORK/reqd")
[[ -z $REG_PID ]] || echo "registry requests until all were reconciled: $(($(requests) - q_start))"
sleep 15 # let the last status writes and Events land
w1=$(writes); o1=$(metric 18090 kiln_operator_api_writes_total)
if [[ -n $REG_PID ]]; then
  AFTER=$(per_pass 18090)
else
  sleep 60
fi
w2=$(writes); o2=$(metric 18090 kiln_operator_api_writes_total)
echo "steady state over 60 s: apiserver writes on jobs/nodes/compiledtargets/modelartifacts/events: $((w2 - w1)); operator's own write counter: $((o2 - o1))"
echo "Jobs after the minute: $(kubectl -n "$NS" get jobs --no-headers 2>/dev/null | wc -l)"
echo "Job creates answered AlreadyExists (a Job posted again): $(kubectl get --raw /metrics | awk '
  /^apiserver_request_total\{/ && /verb="POST"/ && /resource="jobs"/ && /code="409"/ { s += $NF }
  END { printf "%d\n", s }')"
rss=$(awk '/VmHWM/ {printf "%d", $2 / 1024}' "/proc/$OPPID/status")
echo "operator peak RSS: $rss MiB, now $(awk '/VmRSS/ {printf "%d MiB", $2 / 1024}' "/proc/$OPPID/status"); CPU $(cpu_of "$OPPID") s"
curl -fsS http://127.0.0.1:18090/metrics | grep -E '^kiln_operator_(reconcile_duration_seconds_(sum|count)|api_writes_total|classes|status_writes_held)' || true
sizes=$(kubectl -n "$NS" get compiledtarget t-0 -o json | jq -c '[(tostring | length), (del(.metadata.managedFields) | tostring | length), (.status | tostring | length)]')
echo "one target as JSON: $sizes bytes (as served, without managedFields (what the cache keeps), its status alone)"

echo "== leader change: a second replica stands by, the first gets SIGTERM and hands the Lease over"
operator 18091 second >"$WORK/operator-2.log" 2>&1 &
PID2=$!
PIDS_TO_STOP+=("$PID2")
sleep 2 # standing by: listed nothing yet, the Lease is the first's
w1=$(writes)
kill -TERM "$OPPID" "$PID" 2>/dev/null || true
t_change=$(date +%s.%N)
wait "$PID" 2>/dev/null || true
restart_t=
for _ in $(seq 600); do
  c=$(reconciles 18091 2>/dev/null || true)
  if [[ -z $restart_t && ${c:-0} -ge $N ]]; then
    restart_t=$(echo "$(date +%s.%N) - $t_change" | bc)
  fi
  [[ -n $restart_t ]] && break
  sleep 0.5
done
sleep "$(echo "t = 60 - ($(date +%s.%N) - $t_change); if (t > 0) t else 0" | bc)"
w2=$(writes)
o2=$(metric 18091 kiln_operator_api_writes_total)
restart_writes=$((w2 - w1))
PID2P=$(op_pid 18091 $PID2)
printf 'new leader: every target reconciled once after %.1f s; writes in its first minute: apiserver %d, its own counter %d; peak RSS %s MiB, CPU %s s\n' \
  "${restart_t:-nan}" "$restart_writes" "$o2" "$(awk '/VmHWM/ {printf "%d", $2 / 1024}' "/proc/$PID2P/status")" "$(cpu_of "$PID2P")"
kill "$PID2P" "$PID2" 2>/dev/null || true
wait "$PID2" 2>/dev/null || true

if [[ -n $REG_PID ]]; then
  echo "== registry requests per full pass at $N x $M, before (no miss cache) and after"
  "$OP" "${STORE_ARGS[@]}" --no-leader-election --listen 127.0.0.1:18092 --log-format json \
    --agent-image kiln-e2e/agent:bench --max-concurrent-compiles "$L" --store-miss-recheck-seconds 0 \
    >"$WORK/operator-before.log" 2>&1 &
  BPID=$!
  sleep 45 # its first pass over every target, then steady
  BEFORE=$(per_pass 18092)
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
bound=$(echo "$t_targets + $t_jobs" | bc)
ratio=$(echo "$t_operator / $bound" | bc -l)
printf 'bound: %.1f s (%.1f s for %d targets + %.1f s for %d Jobs); operator / bound = %.1f\n' \
  "$bound" "$t_targets" "$N" "$t_jobs" "$jobs" "$ratio"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'RESULT n=%d m=%d l=%d t=%.1f bound=%.1f ratio=%.2f rss=%s cpu=%s api_cpu=%.1f status=%d events=%d other=%d restart_writes=%d restart_t=%.1f load0=%s load1=%s\n' \
  "$N" "$M" "$L" "$t_operator" "$bound" "$ratio" "$rss" "$cpu_done" "$(echo "$cp1 - $cp0" | bc)" \
  "$status_w" "$event_w" "$other_w" "$restart_writes" "${restart_t:-0}" "$LOAD0" "$(cut -d' ' -f1 /proc/loadavg)"
