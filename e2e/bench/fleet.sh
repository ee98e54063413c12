#!/usr/bin/env bash
# Benchmark (not a test): kiln-operator over a fleet of simulated nodes. NODES Node objects and
# their KilnNodes, written the way kiln-agent writes them (fleet-agents.py: each KilnNode owned by
# its Node, its whole status server-side applied as field manager kiln-agent), no kubelets;
# TARGETS CompiledTargets: t-0 selects every node, t-i one of POOLS pools; CLASSES GPU classes.
# Every target is compiled (store entries written here for the compile keys the operator asks
# for) and Ready on every node it selects. Then t-0's spec changes (a new compile key, stored:
# revision 2 at once) and revision 2 rolls across the fleet, RATE nodes starting per second,
# each node reporting Pulling and, a second later, Ready. Reports, over the roll: the operator's
# CPU and peak RSS, the API requests by verb and resource (reads and writes), t-0's status
# writes (total, and the most within one second), and the time from the last node's Ready row
# to t-0's Ready condition on revision 2 (goal <= 2 s). Status writes per target are bounded by
# --status-write-interval-ms (default 1 s, operator/src/recall/pace.rs); KILN_FLEET_INTERVAL_MS=0
# runs the same roll with every change written at once, for comparison.
#
#   e2e/cluster up --control-plane-only
#   e2e/cluster run -- e2e/bench/fleet.sh [NODES] [TARGETS] [POOLS] [CLASSES] [RATE]
#                                                        # defaults 1000 100 10 4 50
#
# Needs target/release/kiln-operator (or debug). `e2e/cluster down` removes everything. The last
# line is `RESULT key=value ...`.
set -euo pipefail
NODES=${1:-1000}
TARGETS=${2:-100}
POOLS=${3:-10}
CLASSES=${4:-4}
RATE=${5:-50}
INTERVAL=${KILN_FLEET_INTERVAL_MS:-1000}
REPO=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
BENCH=$REPO/e2e/bench
OP=$REPO/target/release/kiln-operator
[[ -x $OP ]] || OP=$REPO/target/debug/kiln-operator
WORK=$(mktemp -d /tmp/kiln-fleet.XXXXXX)
NS=fleet
STORE=$WORK/store
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
kubectl apply -f "$REPO/charts/kiln/files/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace "$NS" >/dev/null 2>&1 || true
watch_targets() { python3 "$BENCH/watch-targets.py" "$@"; }

echo "== $NODES simulated nodes ($POOLS pools, $CLASSES GPU classes) and their KilnNodes"
t0=$(date +%s.%N)
python3 "$BENCH/fleet-agents.py" nodes "$NODES" "$POOLS" "$CLASSES"
printf '   in %.1f s\n' "$(echo "$(date +%s.%N) - $t0" | bc)"

echo "== $TARGETS CompiledTargets"
target() { # NAME BATCH [POOL]
  cat <<YAML
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: b, dims: {batch: $2}}]
  warmup: {fixtureVersion: v1}
YAML
  [[ -z ${3:-} ]] || echo "  nodeSelector: {matchLabels: {kiln-bench/pool: $3}}"
}
{
  awk '/^---/ {exit} /^apiVersion/ {on = 1} on' "$REPO/examples/squeezenet/kiln.yaml"
  target t-0 1
  for ((i = 1; i < TARGETS; i++)); do target "t-$i" 1 "p$((i % POOLS))"; done
} | kubectl -n "$NS" apply --server-side -f - >/dev/null

PORT=18095
# The sum of the operator's samples named exactly $1 (labels included).
metric() { curl -fsS "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m {s += $2} END {print s + 0}'; }
mkdir -p "$STORE/artifacts"
"$OP" --store "$STORE" --store-miss-recheck-seconds 1 --max-concurrent-compiles 1 \
  --status-write-interval-ms "$INTERVAL" --no-leader-election --listen "127.0.0.1:$PORT" \
  --log-format json --agent-image kiln-e2e/agent:bench >"$WORK/operator.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT

# Store entries for every compile key the targets' rows name (what a compile Job would publish;
# the operator only reads the build manifest here), then a touch so that each looks again.
store_keys() {
  kubectl -n "$NS" get compiledtargets -o json | jq -r '.items[].status.classes[]?.compileKey // empty' |
    sort -u | while read -r key; do
      [[ -f $STORE/artifacts/$key/manifest.json ]] && continue
      mkdir -p "$STORE/artifacts/$key"
      jq -n --arg k "$key" --arg d "$(echo -n "$key" | sha256sum | cut -c1-64)" '{manifestVersion: 1,
        compileKey: $k, artifactDigest: $d, artifactSize: 4096, mediaType: "application/octet-stream",
        backend: "tract", backendVersion: "0.23.9", toolVersion: "bench", precision: "fp32",
        profiles: {}, class: {}, host: {arch: "amd64", cpuLevel: "x86-64-v3", cores: 64,
        memoryBytes: 549755813888}, flags: {}, inputs: {}, outputs: [], unsupportedOperators: [],
        compileSeconds: 1, converterLog: []}' >"$STORE/artifacts/$key/manifest.json"
    done
  sleep 1.2 # past --store-miss-recheck-seconds
  kubectl -n "$NS" annotate compiledtargets --all "kiln-bench/touch=$(date +%s%N)" --overwrite >/dev/null
}
echo "== compile keys stored, every target compiled"
watch_targets rows "$NS" "$TARGETS" 0 600 >/dev/null 2>&1
store_keys
watch_targets revision "$NS" "$TARGETS" 1 600 >/dev/null 2>&1
echo "== every node reports Ready for every target it serves"
t0=$(date +%s.%N)
python3 "$BENCH/fleet-agents.py" ready "$NS" "$NODES" "$POOLS"
watch_targets allready "$NS" "$TARGETS" 900 >/dev/null 2>"$WORK/ready.log" || { cat "$WORK/ready.log"; tail "$WORK/operator.log"; exit 1; }
printf '   every target Ready %.1f s after the first report\n' "$(echo "$(date +%s.%N) - $t0" | bc)"

echo "== t-0 gets a new revision (new compile key, stored)"
kubectl -n "$NS" patch compiledtarget t-0 --type merge -p '{"spec": {"profiles": [{"name": "b", "dims": {"batch": 2}}]}}' >/dev/null
for _ in $(seq 60); do
  [[ $(kubectl -n "$NS" get compiledtarget t-0 -o json | jq '[.status.classes[]? | select(.artifactDigest == null)] | length') -gt 0 ]] && break
  sleep 0.5
done
store_keys
watch_targets revision "$NS" 1 2 120 >/dev/null 2>&1
sleep 3 # the settled status and labels land

requests_by() {
  kubectl get --raw /metrics | awk '/^apiserver_request_total\{/ {
      v = ""; r = ""
      if (match($0, /verb="[A-Z]+"/)) v = substr($0, RSTART + 6, RLENGTH - 7)
      if (match($0, /resource="[a-z]+"/)) r = substr($0, RSTART + 10, RLENGTH - 11)
      s[v ":" r] += $NF }
    END { for (k in s) print k, s[k] }' | sort
}
cpu() { awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$PID/stat"; }
echo "== roll: revision 2 of t-0 across $NODES nodes, $RATE starting per second (status write interval $INTERVAL ms)"
watch_targets ready "$NS" t-0 2 900 >"$WORK/t0-ready" 2>"$WORK/t0-watch.log" &
WATCH=$!
sleep 1
requests_by >"$WORK/req0"
cpu0=$(cpu) held0=$(metric kiln_operator_status_writes_held_total) st0=$(metric 'kiln_operator_api_writes_total{category="status"}')
t_start=$(date +%s.%N)
last_ready=$(python3 "$BENCH/fleet-agents.py" roll "$NS" "$NODES" "$POOLS" t-0 2 "$RATE")
wait "$WATCH" || { cat "$WORK/t0-watch.log"; tail "$WORK/operator.log"; exit 1; }
t_ready=$(cat "$WORK/t0-ready")
sleep 2
requests_by >"$WORK/req1"
cpu1=$(cpu) held1=$(metric kiln_operator_status_writes_held_total) st1=$(metric 'kiln_operator_api_writes_total{category="status"}')
roll_s=$(echo "$last_ready - $t_start" | bc)
lag=$(echo "$t_ready - $last_ready" | bc)
printf 'roll: %.1f s from the first node to the last Ready row; t-0 Ready on revision 2 %.2f s after the last Ready row (goal <= 2 s)\n' "$roll_s" "$lag"
sed 's/^/   /' "$WORK/t0-watch.log"
echo "operator over the roll: CPU $(echo "$cpu1 - $cpu0" | bc) s; status writes $((st1 - st0)) (held back: $((held1 - held0))); peak RSS $(awk '/VmHWM/ {printf "%d MiB", $2 / 1024}' "/proc/$PID/status")"
echo "API requests over the roll, by verb and resource (every client's: the simulated agents' KilnNode writes too):"
join -a 2 -e 0 -o 0,1.2,2.2 "$WORK/req0" "$WORK/req1" | awk '{ d = $3 - $2; if (d > 0) { sub(":", " ", $1); printf "   %s %d\n", $1, d } }' | tee "$WORK/reqd"
reads=$(awk '$1 ~ /GET|LIST|WATCH/ && $2 != "kilnnodes" {s += $3} END {print s + 0}' "$WORK/reqd")
writes=$(awk '$1 !~ /GET|LIST|WATCH/ && $2 ~ /^(compiledtargets|nodes|jobs|events)$/ {s += $3} END {print s + 0}' "$WORK/reqd")
ct_writes=$(awk '$1 !~ /GET|LIST|WATCH/ && $2 == "compiledtargets" {s += $3} END {print s + 0}' "$WORK/reqd")
per_second=$(sed -n 's/.*at most \([0-9]*\) within one second.*/\1/p' "$WORK/t0-watch.log")
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'RESULT nodes=%d targets=%d interval_ms=%d roll=%.1f lag=%.2f cpu=%.1f rss=%d reads=%d writes=%d target_writes=%d max_per_s=%s held=%d load0=%s load1=%s\n' \
  "$NODES" "$TARGETS" "$INTERVAL" "$roll_s" "$lag" "$(echo "$cpu1 - $cpu0" | bc)" \
  "$(awk '/VmHWM/ {printf "%d", $2 / 1024}' "/proc/$PID/status")" "$reads" "$writes" "$ct_writes" \
  "${per_second:-0}" "$((held1 - held0))" "$LOAD0" "$(cut -d' ' -f1 /proc/loadavg)"
