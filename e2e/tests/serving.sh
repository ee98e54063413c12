#!/usr/bin/env bash
# The last mile on the real cluster: the chart (with the csi.kiln.dev node plugin) and the
# example target; then, in the target's namespace with Pod Security "restricted" enforced, the
# README's serving Deployment (examples/serving/deployment.yaml: kiln-agent serve on the
# csi.kiln.dev volume, annotated oip-v2) and its Service. Asserts: the pod is never Ready before
# the node's row is Ready and the agent has checked its server (the kiln.dev/warm message names the
# figures through the server); inside the pod the volume is read-only and holds the row's digest;
# a real v2 client (tritonclient[http] from PyPI) gets the fixture's golden outputs through the
# Service within tolerance; a killed server container (restart count up) is warmed again before
# the pod is Ready again; after a newer revision turns Ready on the node the running pod stays
# Ready (polled) on its mounted revision 1 and its gate says so, and its replacement mounts revision 2;
# after `kubectl kiln rollback --to 1` the pod on revision 2 stays Ready saying so, and a pod made
# after the rollback mounts revision 1;
# a pod whose volume names a target that does not exist stays
# ContainerCreating with the plugin's reason in the kubelet's Event; a pod whose server is asked
# for a model it does not serve stays not Ready with ServingMismatch; during a `kubectl rollout
# restart` (maxSurge 1, maxUnavailable 0) a client running through the Service (4 workers,
# keep-alive, every answer checked) sees only golden answers and retryable refusals (503 with
# Retry-After, connection refused, a connection closed before the request was written: never a
# wrong answer, another status, a timeout or a request dropped once written), the new pod is Ready
# only after its own server's check, and the old pod is gone before the client stops; a new
# client's first request through the Service is within 1.5x of its own p50 (the goal is 1.2x;
# the margin is for a 2-core machine running the cluster). Prints apply → first serving pod
# Ready, the first request through the Service after Ready against the p50 the agent measured
# through the server and against the client's own, and the rollout's counts, how long the old pod
# took to go and the longest time without a success.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test serving
TARGET=squeezenet-cpu
NETNS=kiln-e2e

PY=$("$REPO/scripts/ensure/v2-client.sh") || skip "no v2 client: scripts/ensure/v2-client.sh needs PyPI once"
kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_images "$WORK/images" || die "images"
T0=$(date +%s.%N)
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"

echo "== the node plugin registered with the kubelet"
wait_for "CSINode lists csi.kiln.dev" 60 bash -c \
  "kubectl get csinode '$REAL' -o json | jq -e '.spec.drivers[]? | select(.name == \"csi.kiln.dev\")' >/dev/null"
kubectl get csidriver csi.kiln.dev -o json | jq -e '.spec.podInfoOnMount and (.spec.volumeLifecycleModes | index("Ephemeral"))' >/dev/null ||
  die "CSIDriver csi.kiln.dev: $(kubectl get csidriver csi.kiln.dev -o json | jq -c .spec)"

echo "== the example target; the compile Job runs before the namespace is restricted"
kubectl -n "$NS" apply -f "$REPO/examples/squeezenet/kiln.yaml" >/dev/null
wait_for "compile Job done" 300 bash -c \
  "kubectl -n '$NS' get jobs -o json | jq -e '.items | length > 0 and all(.status.succeeded == 1)' >/dev/null"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1

AGENT_IMAGE=$(kubectl -n "$NS" get ds kiln-agent -o jsonpath='{.spec.template.spec.containers[?(@.name=="agent")].image}')
[[ -n $AGENT_IMAGE ]] || AGENT_IMAGE=$(kubectl -n "$NS" get ds kiln-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
sed -e "s|IMAGE|$AGENT_IMAGE|" -e "s|NAMESPACE|$NS|" -e "s|squeezenet|$TARGET|g" "$REPO/examples/serving/deployment.yaml" |
  sed 's|^          args: \[serve|          imagePullPolicy: Never\n          args: [serve|' >"$WORK/serving.yaml"
kubectl -n "$NS" apply -f "$WORK/serving.yaml" >/dev/null || die "the restricted namespace refused the serving Deployment"

echo "== never Ready before the row and the check through the server"
pod() { kubectl -n "$NS" get pods -l "app=$TARGET" -o json | jq '.items[0] // empty'; }
serving_ready pod "$T0"
p=$P message=$MESSAGE

echo "== the volume: read-only, the row's digest"
POD=$(jq -r .metadata.name <<<"$p")
DIGEST=$(kubectl get kilnnode "$REAL" -o json | jq -r --arg ns "$NS" --arg t "$TARGET" '.status.targets[] | select(.namespace == $ns and .name == $t) | .artifactDigest')
mnt=$(awk '$5 ~ /volumes\/kubernetes.io~csi\/model\/mount$/ {print $5}' /proc/self/mountinfo | grep "$(jq -r .metadata.uid <<<"$p")" | head -1)
[[ -n $mnt ]] || mnt=$(ip netns exec "$NETNS" true && find /var/lib/kubelet/pods/"$(jq -r .metadata.uid <<<"$p")" -path '*kubernetes.io~csi/model/mount' -maxdepth 5 2>/dev/null | head -1)
[[ -n $mnt ]] || die "no csi mount for pod $POD"
got=$(sha256sum "$mnt/artifact" | cut -d' ' -f1)
[[ $got == "$DIGEST" ]] || die "mounted artifact sha256 $got, row $DIGEST"
jq -e --arg d "$DIGEST" '.digest == $d' "$mnt/kiln.json" >/dev/null || die "kiln.json: $(cat "$mnt/kiln.json")"
grep -E " $(printf '%s' "$mnt" | sed 's/[.[\*^$]/\\&/g') " /proc/self/mountinfo | grep -qE '(^| )ro[, ]' ||
  die "the volume is not mounted read-only"
echo "   $mnt: sha256 $DIGEST, read-only"

echo "== a real v2 client through the Service"
IP=$(kubectl -n "$NS" get svc "$TARGET" -o jsonpath='{.spec.clusterIP}')
FIX=$WORK/sources/fixture-v1.safetensors
check=$(ip netns exec "$NETNS" "$PY" "$REPO/e2e/testdata/v2_check.py" "$IP:8000" "$TARGET" "$FIX" 1e-5 1e-4) ||
  die "tritonclient through the Service: $check"
first_after_ready "$check" '{maxAbsError}'
# A new client of a warm process, after the server sat idle 12 s: its first request against its
# own p50 (the same client and path: the ratio is the connection's and the server's).
first=$(ip netns exec "$NETNS" "$PY" "$REPO/e2e/testdata/first_request.py" "$IP:8000" "$TARGET" "$FIX" 12 30) ||
  die "a new client through the Service: $first"
new_client_first "$first" 1.5

echo "== a restarted server is warmed again"
restarts=$(jq '[.status.containerStatuses[].restartCount] | add' <<<"$p")
uid=$(jq -r .metadata.uid <<<"$p")
pid=$(pgrep -f "kiln-agent serve --model-dir /model --port 8000" | while read -r q; do
  grep -q "$uid" "/proc/$q/cgroup" 2>/dev/null && echo "$q"; done | head -1)
[[ -n $pid ]] || die "no serve process of pod $POD"
kill -9 "$pid"
wait_for "restart counted" 60 bash -c \
  "[[ \$(kubectl -n '$NS' get pod '$POD' -o json | jq '[.status.containerStatuses[].restartCount] | add') -gt $restarts ]]"
again=()
end=$((SECONDS + 120))
while ((SECONDS < end)); do
  q=$(kubectl -n "$NS" get pod "$POD" -o json)
  r=$(cond "$q" kiln.dev/warm reason)
  [[ -n $r && " ${again[*]} " != *" $r "* ]] && again+=("$r")
  [[ $(cond "$q" kiln.dev/warm status) == True && $(cond "$q" Ready status) == True && ${#again[@]} -gt 1 ]] && break
  sleep 0.5
done
[[ $(cond "$q" Ready status) == True ]] || die "not Ready again after the restart (reasons: ${again[*]})"
[[ " ${again[*]} " == *" WarmingServer "* || " ${again[*]} " == *" WaitingForServer "* ]] ||
  die "Ready again without a new check (reasons: ${again[*]})"
echo "   restart → ${again[*]}"

echo "== the agent restarts while the server is replaced: checked again from the node cache's index"
# The fixture a pass warmed with is read from the cache index, not from the agent's memory, so a
# new agent process checks a replaced server at once, without waiting for a warmup of its own.
p=$(kubectl -n "$NS" get pod "$POD" -o json)
restarts=$(jq '[.status.containerStatuses[].restartCount] | add' <<<"$p")
uid=$(jq -r .metadata.uid <<<"$p")
agent=$(pgrep -f '^/bin/kiln-agent run') || die "no agent process"
[[ $(wc -l <<<"$agent") -eq 1 ]] || die "more than one agent process: $agent"
agent_restarts=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=agent -o json | jq '[.items[].status.containerStatuses[].restartCount] | add')
kill -9 "$agent"
pid=$(pgrep -f "kiln-agent serve --model-dir /model --port 8000" | while read -r q; do
  grep -q "$uid" "/proc/$q/cgroup" 2>/dev/null && echo "$q"; done | head -1)
[[ -n $pid ]] || die "no serve process of pod $POD"
kill -9 "$pid"
wait_for "the agent restarted" 60 bash -c \
  "[[ \$(kubectl -n '$NS' get pods -l app.kubernetes.io/component=agent -o json | jq '[.items[].status.containerStatuses[].restartCount] | add') -gt $agent_restarts ]]"
wait_for "the server restarted" 60 bash -c \
  "[[ \$(kubectl -n '$NS' get pod '$POD' -o json | jq '[.status.containerStatuses[].restartCount] | add') -gt $restarts ]]"
seen=()
end=$((SECONDS + 120))
while ((SECONDS < end)); do
  q=$(kubectl -n "$NS" get pod "$POD" -o json)
  r=$(cond "$q" kiln.dev/warm reason)
  [[ -n $r && " ${seen[*]} " != *" $r "* ]] && seen+=("$r")
  [[ $(cond "$q" kiln.dev/warm status) == True && $(cond "$q" Ready status) == True && ${#seen[@]} -gt 1 ]] && break
  sleep 0.5
done
msg=$(cond "$q" kiln.dev/warm message)
[[ $(cond "$q" Ready status) == True ]] || die "not Ready again after the agent's restart (reasons: ${seen[*]}; $msg)"
[[ " ${seen[*]} " == *" WarmingServer "* || " ${seen[*]} " == *" WaitingForServer "* ]] ||
  die "Ready again without a new check of the replaced server (reasons: ${seen[*]})"
grep -q "through the server" <<<"$msg" || die "the gate does not name the check through the server: $msg"
if kubectl -n "$NS" logs -l app.kubernetes.io/component=agent --tail=-1 | grep -q 'records no fixture'; then
  die "the restarted agent refused a check for want of the fixture"
fi
echo "   agent and server restarted → ${seen[*]}"

echo "== a newer revision: the running pod keeps its volume and says so; a new pod mounts the new one"
# The compile Job reads the example's sources from a hostPath, which restricted forbids: lifted
# for the compile, enforced again before any serving pod is made.
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce- >/dev/null
kubectl -n "$NS" patch compiledtarget "$TARGET" --type=merge \
  -p '{"spec":{"profiles":[{"name":"batch1b","dims":{"batch":1}}]}}' >/dev/null
rev_is() {
  [[ $(kubectl get kilnnode "$REAL" -o json | jq -r --arg ns "$NS" --arg t "$TARGET" \
    '.status.targets[]? | select(.namespace == $ns and .name == $t) | "\(.revision) \(.phase)"') == "$1" ]]
}
wait_for "revision 2 Ready on the node" 300 rev_is "2 Ready"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1
# keeps N POD: POD stays Ready (polled) until its gate says its volume holds revision N.
keeps() {
  local msg end=$((SECONDS + 120))
  while ((SECONDS < end)); do
    msg=$(kubectl -n "$NS" get pod "$2" -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].message}')
    [[ $(kubectl -n "$NS" get pod "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]] ||
      die "the pod on revision $1 left Ready while the node moved to another: $msg"
    grep -q "volume holds revision $1" <<<"$msg" && { echo "   $2: $(cut -c1-170 <<<"$msg")"; return; }
    sleep 0.5
  done
  die "the pod on revision $1 does not say it holds revision $1: $msg"
}
# replaced N OLD...: the OLD pods deleted, a new pod is Ready and its volume holds revision N.
replaced() {
  local n=$1 old uid mnt
  shift
  kubectl -n "$NS" delete pod "$@" --ignore-not-found --wait=false >/dev/null
  old=$(printf '%s\n' "$@" | jq -R . | jq -cs .)
  others() { jq --argjson old "$old" '[.items[] | select(.metadata.name as $n | $old | index($n) | not)]'; }
  new_ready() {
    kubectl -n "$NS" get pods -l "app=$TARGET" -o json | others | jq -e '[.[] | select(.metadata.deletionTimestamp == null)
      | .status.conditions[]? | select(.type == "Ready" and .status == "True")] | length > 0'
  }
  wait_for "a new pod Ready" 180 new_ready
  uid=$(kubectl -n "$NS" get pods -l "app=$TARGET" -o json | others | jq -r '.[0].metadata.uid')
  mnt=$(awk '$5 ~ /volumes\/kubernetes.io~csi\/model\/mount$/ {print $5}' /proc/self/mountinfo | grep "$uid" | head -1)
  [[ -n $mnt ]] && jq -e --argjson n "$n" '.revision == $n' "$mnt/kiln.json" >/dev/null ||
    die "the new pod does not mount revision $n: $(cat "$mnt/kiln.json" 2>/dev/null)"
  echo "   the new pod mounts revision $n"
}
# The same server passed before: it stays Ready while it is checked again under revision 2.
keeps 1 "$POD"
replaced 2 "$POD"

echo "== kubectl kiln rollback to revision 1: the running pod keeps revision 2 and says so; a new pod mounts 1"
mkdir -p "$WORK/bin"
cp "$(bin kubectl-kiln)" "$WORK/bin/kubectl-kiln"
POD2=$(kubectl -n "$NS" get pods -l "app=$TARGET" -o json | jq -r --arg old "$POD" '[.items[] | select(.metadata.name != $old)][0].metadata.name')
t_rb=$(date +%s.%N)
rb=$(PATH=$WORK/bin:$PATH kubectl kiln -n "$NS" rollback "$TARGET" --to 1 --wait --timeout 120 -o json) || die "rollback: $rb"
wait_for "revision 1 served on the node" 60 rev_is "1 Ready"
keeps 2 "$POD2"
printf '   rollback served on the node after %s s\n' "$(jq -r .servedAfterSeconds <<<"$rb")"
replaced 1 "$POD" "$POD2"
printf '   Ready %.1f s after the rollback began\n' "$(echo "$(date +%s.%N) - $t_rb" | bc)"

echo "== refusals: no target, wrong model name"
# nope NAME TARGET MODEL-NAME: a kiln-agent serve pod that must stay not Ready.
nope() {
  gated_pod "$1" "$2" "kiln.dev/protocol: oip-v2, kiln.dev/port: \"8000\", kiln.dev/model-name: $3" "$AGENT_IMAGE" \
    '[serve, --model-dir, /model, --port, "8000"]' /v2/health/ready 8000 | kubectl -n "$NS" apply -f - >/dev/null
}
nope ghost ghost ghost
wait_for "mount refused with the reason" 90 bash -c \
  "kubectl -n '$NS' get events --field-selector involvedObject.name=ghost,reason=FailedMount -o json | jq -e '.items[] | select(.message | contains(\"ghost\"))' >/dev/null"
echo "   $(kubectl -n "$NS" get events --field-selector involvedObject.name=ghost,reason=FailedMount -o json | jq -r '.items[0].message' | cut -c1-200)"
nope wrongname "$TARGET" other
wait_for "wrong model name: ServingMismatch" 120 bash -c \
  "[[ \$(kubectl -n '$NS' get pod wrongname -o jsonpath='{.status.conditions[?(@.type==\"kiln.dev/warm\")].reason}') == ServingMismatch ]]"
[[ $(kubectl -n "$NS" get pod wrongname -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') != True ]] ||
  die "a pod whose server does not serve the model is Ready"
echo "   wrongname: $(kubectl -n "$NS" get pod wrongname -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].message}' | cut -c1-160)"
kubectl -n "$NS" delete pod ghost wrongname --wait=false >/dev/null

echo "== a rolling restart under load loses no request"
# e2e/testdata/rollout_client.py sends the fixture through the Service from 4 workers on
# keep-alive connections and checks every answer, while `kubectl rollout restart` replaces the
# pod: the Deployment adds one new pod (maxSurge 1, maxUnavailable 0) and deletes the old one only
# once the new one has passed its gate; the old server, on SIGTERM, is unready at once, answers
# new requests 503 with Retry-After, finishes the ones it has and exits. The client may see only
# golden answers and the refusals it may retry (its docstring says which, and why). Last in the
# file: the pod's name changes here, and the sections above find their pods by name.
STOP=$WORK/rollout.stop PROGRESS=$WORK/rollout.progress
old=$(kubectl -n "$NS" get pods -l "app=$TARGET" -o json | jq -c '[.items[].metadata.name]')
ip netns exec "$NETNS" "$PY" "$REPO/e2e/testdata/rollout_client.py" "$IP:8000" "$TARGET" "$FIX" 1e-5 1e-4 \
  "$STOP" 360 --progress "$PROGRESS" >"$WORK/rollout.json" 2>"$WORK/rollout.err" &
CLIENT=$!
teardown() { [[ -z ${CLIENT:-} ]] || kill "$CLIENT" 2>/dev/null || true; }
end=$((SECONDS + 30))
until jq -e '.ok >= 5' "$PROGRESS" >/dev/null 2>&1; do
  kill -0 "$CLIENT" 2>/dev/null || die "the client ended before the restart: $(cat "$WORK/rollout.json") $(tail -3 "$WORK/rollout.err")"
  ((SECONDS < end)) || die "no answers through the Service within 30 s: $(cat "$PROGRESS" 2>/dev/null)"
  sleep 0.2
done
t_restart=$(date +%s.%N)
kubectl -n "$NS" rollout restart "deployment/$TARGET" >/dev/null
# The new pod: never Ready before its own server's check (serving_ready, as for the first pod).
new_pod() {
  kubectl -n "$NS" get pods -l "app=$TARGET" -o json |
    jq --argjson old "$old" '[.items[] | select(.metadata.name as $n | $old | index($n) | not)][0] // empty'
}
serving_ready new_pod "$t_restart"
kubectl -n "$NS" rollout status "deployment/$TARGET" --timeout=120s >/dev/null || die "the rollout did not finish"
t_rolled=$(date +%s.%N)
# The old server exits by itself once drained (--drain-timeout-seconds, 25 by default; at once
# when idle, about 2 s after SIGTERM), before the kubelet's SIGKILL at
# terminationGracePeriodSeconds (30): the time it took is printed below.
old_gone() {
  kubectl -n "$NS" get pods -l "app=$TARGET" -o json |
    jq -e --argjson old "$old" '[.items[] | select(.metadata.name as $n | $old | index($n))] | length == 0'
}
wait_for "the old pod gone (terminationGracePeriodSeconds 30)" 45 old_gone
t_gone=$(date +%s.%N)
sleep 3
touch "$STOP"
wait "$CLIENT" || true
CLIENT=
out=$(tail -1 "$WORK/rollout.json")
jq -e '.wrong == 0 and .failed == 0 and .ok > 20 and .stoppedBy == "stop-file"' <<<"$out" >/dev/null 2>&1 ||
  die "a request lost or wrong across the rolling restart: ${out:-no report: $(tail -3 "$WORK/rollout.err")}"
echo "   $(jq -c '{ok, refused, refusedBy, wrong, failed, retried, abandoned, seconds}' <<<"$out")"
printf '   restart → rolled out %.1f s, old pod gone %.1f s; longest time without a success %s ms (at %s s of %s s)\n' \
  "$(echo "$t_rolled - $t_restart" | bc)" "$(echo "$t_gone - $t_restart" | bc)" \
  "$(jq -r .longestGapMs <<<"$out")" "$(jq -r .longestGapFromS <<<"$out")" "$(jq -r .seconds <<<"$out")"
echo "serving: pod Ready only after the row and its own server's check; golden outputs through the Service, across a rolling restart too"
