#!/usr/bin/env bash
# Benchmark-side fault table (not a test: too slow for CI): three faults of e2e/tests/faults.sh at
# real sizes, on the real e2e cluster, with a generated GGUF llama model of SIZE GB (default 1;
# 4 works: the agent's memory limit is raised as sizes.sh does) served as is (the q4_0 variant of
# sizes.sh: no quantisation, the compile copies it) by llama-server pods. The set-up is
# sizes.sh's (sizes-common.sh: the cached model and fixture, kiln installed by its chart with the
# store on the cluster's registry, the ModelArtifact + CompiledTarget, the README's llama-server
# Deployment). The faults are injected by sizes-faults.py, tight loops over /proc, the node cache
# and the containers' log files, so that each lands inside its window (a fraction of a second):
#
#   1 agent killed mid-pull   the `kiln-agent run` process SIGKILLed (the kubelet restarts its
#                             container) at the first `pulling` log line at or over
#                             $KILN_FAULTS_KILL_PERCENT (60; 20 to 80 accepted, so that a pull
#                             that started again from byte 0 would cost 1.6x); PASS when the
#                             bytes it kept (tmp/pull-<digest>/.kiln-partial-*) are 20–80% of the
#                             artifact, the new agent logs `resuming a pull from the bytes an
#                             earlier one kept` with at least those bytes, the bytes through the
#                             pod bridge cni0 (registry traffic; from the first agent's
#                             `preparing` to the new one's `artifact pulled and verified`) are
#                             under 1.5x the artifact, and the node's row becomes Ready.
#   2 CSI plugin killed       the `kiln-csi` process SIGKILLed while the first pod's
#     mid-publish             NodePublishVolume builds its volume: its directory in the cache's
#                             published/ holds the artifact link and no kiln.json yet, and the
#                             plugin has read $KILN_FAULTS_CSI_READ (0.3) of the artifact's bytes
#                             (the first publish after a plugin start hashes it); PASS when no
#                             mount at the pod's volume is ever writable, the pod becomes Ready
#                             after the kubelet retries, and then published/ holds exactly its
#                             volume, complete (kiln.json naming the row's digest, the artifact
#                             the cache's inode), mounted read-only, published by the restarted
#                             plugin (hashed=true), the killed one having logged no publish of it.
#   3 serving pod killed      the Deployment scaled to 2; the new pod's llama-server SIGKILLed
#     during its load         while it loads the model (/health 503, or the model mapped and not
#                             yet 200), and the pod deleted; PASS when the killed pod was never
#                             Ready, and its replacement (a new pod uid) is checked by the agent
#                             (`checking a serving pod through its endpoint` for its uid, then
#                             `serving pod warm` for its server) before its first Ready, and never
#                             Ready before that.
#
# Prints one PASS/FAIL line per row with its figures, then the table and `RESULT key=value ...`;
# exits 1 when a row failed. A row whose fault missed its window fails too (the note says so).
#
#   e2e/cluster up
#   export KILN_E2E_BIN_DIR=/path/to/release/bins   # as sizes.sh
#   e2e/cluster run -- e2e/bench/sizes-faults.sh [SIZE]
#   # or, holding the e2e lock around a cluster of its own:
#   flock /tmp/kiln-e2e.lock bash -c 'e2e/cluster up && e2e/cluster run -- e2e/bench/sizes-faults.sh 1; e2e/cluster down'
#
# Needs root, llama-server (scripts/ensure/llama-tools.sh llama-server) and the disk sizes.sh
# needs for one q4_0 variant (the cached model, its registry blob, the node cache: 3 x SIZE GB);
# refuses to start with / over $KILN_BENCH_MAX_DISK_PCT (70) percent used. Results (the fault
# JSON, logs, watches) in $KILN_BENCH_OUT (default a new /tmp/kiln-bench-sizes-faults.XXXXXX).
set -euo pipefail
REPO=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
BENCH=$REPO/e2e/bench
source "$REPO/e2e/tests/lib.sh"
source "$REPO/e2e/tests/kiln-lib.sh"
source "$REPO/e2e/tests/observe-lib.sh" # wait_until
SIZE=${1:-1}
[[ $SIZE =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "usage: $0 [SIZE_GB]" >&2; exit 2; }
OUT=${KILN_BENCH_OUT:-$(mktemp -d /tmp/kiln-bench-sizes-faults.XXXXXX)}
source "$BENCH/sizes-common.sh"
mkdir -p "$OUT" "$CACHE"
KILL_PCT=${KILN_FAULTS_KILL_PERCENT:-60}
CSI_READ=${KILN_FAULTS_CSI_READ:-0.3}
((KILL_PCT >= 20 && KILL_PCT <= 80)) || { echo "KILN_FAULTS_KILL_PERCENT must be 20 to 80" >&2; exit 2; }
# How long each row may take to recover (the kubelet's back-off after a kill is part of it).
LIMIT=$(echo "(240 + 120 * $SIZE) / 1" | bc)
FAULTS="python3 $BENCH/sizes-faults.py"
die() {
  [[ -z $NS ]] || kiln_diagnose "$NS" "$REAL"
  fail "$*"
}
WATCHERS=() KILLER=
on_exit() {
  [[ -z $KILLER ]] || kill "$KILLER" 2>/dev/null || true
  ((${#WATCHERS[@]} == 0)) || kill "${WATCHERS[@]}" 2>/dev/null || true
  teardown_variant
}
trap on_exit EXIT

# Verdicts: ROW_RESULT[n] PASS/FAIL, ROW_FIG[n] the figures, ROW_WHY[n] what failed.
declare -A ROW_RESULT=() ROW_FIG=() ROW_WHY=()
ROW_NAME=([1]="agent killed mid-pull" [2]="CSI plugin killed mid-publish" [3]="serving pod killed during its load")
bad() { ROW_WHY[$1]+="${ROW_WHY[$1]:+; }$2"; }
verdict() {
  local n=$1
  if [[ -z ${ROW_WHY[$n]:-} ]]; then ROW_RESULT[$n]=PASS; else ROW_RESULT[$n]=FAIL; fi
  echo "   row $n ${ROW_NAME[$n]}: ${ROW_RESULT[$n]}: ${ROW_FIG[$n]:-}${ROW_WHY[$n]:+ -- FAILED: ${ROW_WHY[$n]}}"
}
j() { jq -r "$1" "$2"; }
calc() { echo "scale=6; $*" | bc; }
fmt() { printf "%.${2:-2}f" "$1"; }
mb() { printf '%.0f MB' "$(calc "$1 / 1000000")"; }
row_json() {
  kubectl get kilnnode "$REAL" -o json 2>/dev/null |
    jq -c --arg ns "$NS" --arg t "$TARGET" '.status.targets[]? | select(.namespace == $ns and .name == $t)'
}
row_ready() { row_json | jq -e '.phase == "Ready"' >/dev/null; }
# wait_row_ready SECS: polls the node's row every 0.2 s until Ready; T_ROW_READY the time seen.
wait_row_ready() {
  local end=$((SECONDS + $1))
  T_ROW_READY=
  while ((SECONDS < end)); do
    row_ready && { T_ROW_READY=$(now); return 0; }
    sleep 0.2
  done
  return 1
}
# The first pods' watch line at or after T showing pod UID Ready (its stamp).
pod_ready_seen() { awk -v u="$1" -v a="$2" '$1 >= a && $3 == u && $4 == "True" { print $1; exit }' "$D/pods.watch"; }
pods_json() { kubectl -n "$NS" get pods -l "app=$TARGET" -o json; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores); results in $OUT"
sizes_images "$OUT/images"
# shellcheck disable=SC2034 # set by variant_setup; only some are used here
declare src quant atol model fix len size_b sha_src
variant_setup "$SIZE" q4_0
WATCHERS=()
python3 "$BENCH/sizes-lib.py" watch "$D/pods.watch" kubectl -n "$NS" get pods -l "app=$TARGET" -w -o \
  jsonpath='{.metadata.name} {.metadata.uid} {.status.conditions[?(@.type=="Ready")].status}{"\n"}' &
WATCHERS+=($!)
sleep 1 # the watches have listed

# --- row 1: the agent killed mid-pull ----------------------------------------------------------
echo "== row 1: ${ROW_NAME[1]} (at the first pulling line at or over $KILL_PCT%)"
agent_pod=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}')
agent_uid=$(kubectl -n "$NS" get pod "$agent_pod" -o jsonpath='{.metadata.uid}')
logdir=$STATE/pod-logs/${NS}_${agent_pod}_${agent_uid}/agent
[[ -d $logdir ]] || die "no log directory of the agent's container at $logdir"
$FAULTS agent-kill "$logdir" "$WORK/cache" "$KILL_PCT" 80 "$LIMIT" "$D/row1.json" &
KILLER=$!
sleep 0.5 # it has found the agent process and its log
t_apply=$(now)
kubectl -n "$NS" apply -f "$D/objects.yaml" >/dev/null || die "apply the model and target"
rc=0
wait "$KILLER" || rc=$?
KILLER=
[[ -f $D/row1.json ]] || die "agent-kill wrote nothing (exit $rc)"
((rc == 0)) || bad 1 "the kill: $(j '.missed // "exit '"$rc"'"' "$D/row1.json")"
wait_row_ready "$LIMIT" || { bad 1 "the row not Ready ${LIMIT}s after the kill: $(row_json)"; verdict 1; die "row 1: no Ready row to go on with"; }
kubectl -n "$NS" logs "$agent_pod" -c agent --previous >"$D/agent-killed.log" 2>&1 || true
kubectl -n "$NS" logs "$agent_pod" -c agent >"$D/agent-row1.log" 2>&1 || true
digest=$(row_json | jq -r .artifactDigest)
art=$(find "$WORK/cache" -path '*/artifacts/*' -name artifact -type f | head -1)
ART=$(stat -c %s "$art")
if [[ $(j '.kill != null' "$D/row1.json") == true ]]; then
  t_kill1=$(j .kill.t "$D/row1.json")
  kept=$(j '.kept // 0' "$D/row1.json")
  resumed=$(j '.resumed // 0' "$D/row1.json")
  net=$(j '.net.bytes // 0' "$D/row1.json")
  t_ready=$T_ROW_READY
  kept_pct=$(calc "100 * $kept / $ART")
  ratio=$(calc "$net / $ART")
  ROW_FIG[1]="killed at the ${KILL_PCT}%+ line ($(j .kill.percent "$D/row1.json")%: $(mb "$(j .kill.bytes "$D/row1.json")") logged), $(mb "$kept") kept ($(fmt "$kept_pct" 0)%); resumed from $(mb "$resumed"); registry (cni0) $(mb "$net") = $(fmt "$ratio")x the $(mb "$ART") artifact; kill → row Ready $(fmt "$(calc "$t_ready - $t_kill1")" 1) s (polled)"
  (($(echo "$kept_pct >= 20 && $kept_pct <= 80" | bc))) || bad 1 "kept $(fmt "$kept_pct" 0)% of the artifact, not 20–80%"
  ((resumed > 0)) || bad 1 "the new agent did not resume: no 'resuming a pull from the bytes an earlier one kept' (its pull lines: $(jq -c '[.lines[] | select(.gen > 0) | .message + " " + ((.percent // "") | tostring)]' "$D/row1.json"))"
  ((resumed == 0 || resumed >= kept)) || bad 1 "resumed at byte $resumed, below the $kept bytes kept"
  [[ $(j '.net != null' "$D/row1.json") == true ]] || bad 1 "no registry byte count (no preparing / pulled lines?)"
  (($(echo "$ratio < 1.5" | bc))) || bad 1 "registry bytes $(fmt "$ratio")x the artifact (limit 1.5x)"
  [[ $digest == *"$(basename "$(dirname "$art")")" ]] || bad 1 "the row's digest $digest is not the cached artifact's"
  [[ -z $(find "$WORK/cache/tmp" -name '.kiln-partial-*' 2>/dev/null) ]] || bad 1 "a partial file is left in tmp/: $(find "$WORK/cache/tmp" -name '.kiln-partial-*' -printf '%p %s\n')"
fi
verdict 1

# --- row 2: the CSI plugin killed while publishing the first pod's volume ---------------------
echo "== row 2: ${ROW_NAME[2]} (once it has read $CSI_READ of the artifact)"
csi_pod=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=csi -o jsonpath='{.items[0].metadata.name}')
$FAULTS csi-kill "$WORK/cache" "$ART" "$CSI_READ" "$LIMIT" "$D/row2.json" &
KILLER=$!
sleep 0.5
kubectl -n "$NS" apply -f "$D/serving.yaml" >/dev/null || die "apply the llama-server Deployment"
rc=0
wait "$KILLER" || rc=$?
KILLER=
[[ -f $D/row2.json ]] || die "csi-kill wrote nothing (exit $rc)"
((rc == 0)) || bad 2 "the kill: $(j '.missed // "exit '"$rc"'"' "$D/row2.json")"
vol=$(j '.volume // ""' "$D/row2.json")
pj=$(pods_json | jq -c '.items[0] // empty')
pod1=$(jq -r .metadata.name <<<"$pj") uid1=$(jq -r .metadata.uid <<<"$pj")
volpath=$KUBELET_DIR/pods/$uid1/volumes/kubernetes.io~csi
# Until the pod is Ready: no mount of its volume (nor of the volume's directory) ever writable;
# what published/ held for the volume, as seen at each look.
states=() writable=() t_ready= end=$((SECONDS + LIMIT))
while ((SECONDS < end)); do
  while read -r mp opt; do
    [[ -n $mp && $opt != ro ]] && writable+=("$mp $opt")
  done < <(awk -v a="$volpath/" -v v="/published/$vol" '(index($5, a) == 1 || (v != "/published/" && index($5, v))) { split($6, o, ","); print $5, o[1] }' /proc/self/mountinfo)
  if [[ -n $vol ]]; then
    if [[ ! -d $WORK/cache/published/$vol ]]; then s=absent
    elif [[ -f $WORK/cache/published/$vol/kiln.json ]]; then s=complete
    else s=incomplete; fi
    [[ ${states[*]: -1} == "$s" ]] || states+=("$s")
  fi
  if [[ $(kubectl -n "$NS" get pod "$pod1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; then
    t_ready=$(now)
    break
  fi
  sleep 0.2
done
kubectl -n "$NS" logs "$csi_pod" -c csi --previous >"$D/csi-killed.log" 2>&1 || true
kubectl -n "$NS" logs "$csi_pod" -c csi >"$D/csi-row2.log" 2>&1 || true
t_seen=$(pod_ready_seen "$uid1" 0)
if [[ $(j '.kill != null' "$D/row2.json") == true ]]; then
  t_kill2=$(j .kill.t "$D/row2.json")
  retries=$(kubectl -n "$NS" get events --field-selector "involvedObject.name=$pod1,reason=FailedMount" -o json | jq '[.items[] | (.series.count // .count // 1)] | add // 0')
  ROW_FIG[2]="killed $(fmt "$(j .kill.since_seen "$D/row2.json")") s into the build of $vol, the plugin having read $(mb "$(j .kill.read "$D/row2.json")") of $(mb "$ART"); its directory then held [$(j '.held | if type == "array" then join(", ") else . end' "$D/row2.json")], mounts of it: $(j '.mounts | length' "$D/row2.json"); published/ seen after: ${states[*]:-?}; FailedMount events $retries; kill → pod Ready $(fmt "$(calc "${t_seen:-${t_ready:-$(now)}} - $t_kill2")" 1) s"
  [[ $(j '.held | if type == "array" then (index("kiln.json") == null) else false end' "$D/row2.json") == true ]] ||
    bad 2 "the volume was complete at the kill: $(jq -c .held "$D/row2.json")"
  [[ $(j '[.mounts[] | select(.[1] != "ro")] | length' "$D/row2.json") == 0 ]] || bad 2 "a writable mount at the kill: $(jq -c .mounts "$D/row2.json")"
fi
((${#writable[@]} == 0)) || bad 2 "a writable mount of the volume: ${writable[*]}"
if [[ -z $t_ready ]]; then
  bad 2 "pod $pod1 not Ready ${LIMIT}s after the kill (published/: $(ls -A "$WORK/cache/published" 2>/dev/null | tr '\n' ' '))"
  verdict 2
  die "row 2: no Ready pod to go on with"
fi
# The state it recovered to: exactly its volume, complete, the cache's inode, mounted read-only.
pub=$(ls -A "$WORK/cache/published" 2>/dev/null | tr '\n' ' ')
[[ $pub == "$vol " ]] || bad 2 "published/ holds [$pub], want exactly [$vol]"
if [[ -f $WORK/cache/published/$vol/kiln.json ]]; then
  kd=$(jq -r .digest "$WORK/cache/published/$vol/kiln.json")
  [[ $digest == *"$kd" ]] || bad 2 "kiln.json names $kd, the row $digest"
  [[ $(jq -r .pod "$WORK/cache/published/$vol/kiln.json") == "$NS/$pod1" ]] || bad 2 "kiln.json names pod $(jq -r .pod "$WORK/cache/published/$vol/kiln.json")"
  [[ $(stat -c %i "$WORK/cache/published/$vol/artifact") == $(stat -c %i "$art") ]] || bad 2 "the volume's artifact is not the cache's inode"
else
  bad 2 "no kiln.json in published/$vol after the pod is Ready"
fi
mnt=$(awk -v a="$volpath/" 'index($5, a) == 1 { split($6, o, ","); print o[1] }' /proc/self/mountinfo | sort -u | tr '\n' ' ')
[[ $mnt == "ro " ]] || bad 2 "the pod's volume mounts are [$mnt], want read-only"
grep -q "\"volume\":\"$vol\".*published read-only\|published read-only.*\"volume\":\"$vol\"" "$D/csi-killed.log" &&
  bad 2 "the killed plugin had logged its publish of $vol (the kill came after it)"
pubs=$(grep '"published read-only"' "$D/csi-row2.log" | jq -c --arg v "$vol" 'select(.fields.volume == $v) | .fields' || true)
[[ -n $pubs ]] || bad 2 "the restarted plugin logged no publish of $vol"
[[ -z $pubs || $(jq -s 'any(.[]; .hashed == true)' <<<"$pubs") == true ]] || bad 2 "the restarted plugin published $vol without hashing it: $pubs"
[[ -z $pubs ]] || ROW_FIG[2]+="; republished by the new plugin (hashed=$(jq -r .hashed <<<"$pubs" | head -1), $(fmt "$(jq -r .seconds <<<"$pubs" | head -1)") s)"
verdict 2

# --- row 3: a serving pod killed during its load -----------------------------------------------
echo "== row 3: ${ROW_NAME[3]} (the second replica's llama-server, then its pod)"
$FAULTS llama-kill "$uid1" 8080 "$LIMIT" "$D/row3.json" &
KILLER=$!
sleep 0.3
kubectl -n "$NS" scale "deploy/$TARGET" --replicas=2 >/dev/null
rc=0
wait "$KILLER" || rc=$?
KILLER=
[[ -f $D/row3.json ]] || die "llama-kill wrote nothing (exit $rc)"
((rc == 0)) || bad 3 "the kill: $(j '.missed // "exit '"$rc"'"' "$D/row3.json")"
uid2=$(j '.uid // ""' "$D/row3.json")
pod2=$(pods_json | jq -r --arg u "$uid2" '.items[] | select(.metadata.uid == $u) | .metadata.name')
[[ -z $pod2 ]] || kubectl -n "$NS" delete pod "$pod2" --wait=false >/dev/null
t_kill3=$(j '.kill.t // empty' "$D/row3.json")
[[ -n $t_kill3 ]] || t_kill3=$(now)
replaced() {
  pods_json | jq -e --arg a "$uid1" --arg b "$uid2" '[.items[] | select(.metadata.uid != $a and .metadata.uid != $b)
    | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length == 1' >/dev/null
}
if ! wait_until "$LIMIT" replaced; then
  bad 3 "no replacement pod Ready within ${LIMIT}s: $(pods_json | jq -c '[.items[] | {n: .metadata.name, r: [.status.conditions[]? | select(.type == "Ready" or .type == "kiln.dev/warm") | .status + "/" + (.reason // "")]}]')"
  verdict 3
  die "row 3: no replacement"
fi
pj3=$(pods_json | jq -c --arg a "$uid1" --arg b "$uid2" '[.items[] | select(.metadata.uid != $a and .metadata.uid != $b)][0]')
pod3=$(jq -r .metadata.name <<<"$pj3") uid3=$(jq -r .metadata.uid <<<"$pj3")
sleep 1 # the watch has the Ready line
kubectl -n "$NS" logs "$agent_pod" -c agent >"$D/agent.log" 2>&1 || true
$FAULTS serving-check "$D/agent.log" "$D/pods.watch" "$uid2" "$uid3" "$t_kill3" "$D/row3-check.json" ||
  die "serving-check failed"
C=$D/row3-check.json
t_check=$(j '.replacement.checks[0].t // empty' "$C")
t_warm=$(j '[.replacement.checks[] | .outcome | select(. != null and .message == "serving pod warm") | .t][0] // empty' "$C")
t_r3=$(j '.replacement.first_ready // empty' "$C")
rel() { [[ -n $1 ]] && fmt "$(calc "$1 - $t_kill3")" || echo "?"; }
ROW_FIG[3]="killed $pod2's llama-server $(fmt "$(j '.kill.since_seen // 0' "$D/row3.json")") s after its process appeared (/health $(j '.kill.health // "?"' "$D/row3.json") $(j '.kill.body // "" | tojson' "$D/row3.json"), /model/artifact mapped: $(j '.kill.mapped | tostring' "$D/row3.json")), pod deleted; replacement $pod3: check started +$(rel "$t_check") s, serving pod warm +$(rel "$t_warm") s, Ready +$(rel "$t_r3") s after the kill ($(j '.replacement.checks | length' "$C") check(s): $(j '[.replacement.checks[].outcome.message // "none"] | join(", ")' "$C")); killed pod: Ready $(j '.killed.first_ready != null' "$C"), $(j '.killed.checks | length' "$C") check(s)"
[[ $(j '.killed.first_ready' "$C") == null ]] || bad 3 "the killed pod $pod2 was Ready at $(j .killed.first_ready "$C")"
[[ -n $t_check ]] || bad 3 "no 'checking a serving pod through its endpoint' for the replacement (uid $uid3)"
[[ -n $t_warm ]] || bad 3 "no 'serving pod warm' for the replacement's server"
[[ -n $t_r3 ]] || bad 3 "the watch saw no Ready for $pod3"
if [[ -n $t_check && -n $t_warm && -n $t_r3 ]]; then
  (($(echo "$t_check < $t_warm && $t_warm < $t_r3" | bc))) || bad 3 "out of order: check $t_check, warm $t_warm, Ready $t_r3"
  early=$(jq -r --argjson w "$t_warm" '[.replacement.watch[] | select(.t < $w and .ready == "True")] | length' "$C")
  ((early == 0)) || bad 3 "$pod3 Ready before its check was warm ($early watch lines)"
fi
msg=$(jq -r '.status.conditions[]? | select(.type == "kiln.dev/warm") | .message' <<<"$pj3")
[[ $msg == *"within tolerance"* ]] || bad 3 "its kiln.dev/warm message: $msg"
verdict 3

kill "${WATCHERS[@]}" 2>/dev/null || true
WATCHERS=()
echo
echo "### sizes-faults: $SIZE GB q4_0 (artifact $(mb "$ART")), $(date -u +%FT%TZ)"
echo
echo "| row | result | figures |"
echo "|---|---|---|"
failed=0
for n in 1 2 3; do
  r=${ROW_RESULT[$n]:-FAIL}
  [[ $r == PASS ]] || failed=1
  echo "| $n ${ROW_NAME[$n]} | $r | ${ROW_FIG[$n]:-}${ROW_WHY[$n]:+ — FAILED: ${ROW_WHY[$n]}} |"
done
echo
echo "RESULT size=$SIZE artifact_mb=$(calc "$ART / 1000000" | cut -d. -f1) row1=${ROW_RESULT[1]:-FAIL} row2=${ROW_RESULT[2]:-FAIL} row3=${ROW_RESULT[3]:-FAIL} total_s=$(fmt "$(calc "$(now) - $t_apply")" 0)"
((failed == 0)) || exit 1
