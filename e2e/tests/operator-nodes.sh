#!/usr/bin/env bash
# kiln-operator turns node reports into target status (set-up in operator-lib.sh): KilnNodes of
# three fake nodes carry status rows written the way the agent writes them (server-side apply on
# the status subresource, field manager kiln-agent); the test asserts per-class aggregation, the
# node readiness label appearing and disappearing, promotion to knownGood at
# rollout.promoteAtReadyPercent, Ready/Degraded/Stalled semantics, and label removal when the
# target is deleted. The artifact comes from a real compile on the real node: a second target
# with the same model, profile and class facts on the fake nodes finds its key in the store.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/observe-lib.sh"
source "$(dirname "$0")/operator-lib.sh"
FAKES=("fake-a-$NS" "fake-b-$NS" "fake-c-$NS")
# shellcheck disable=SC2034 # read by cleanup (operator-lib.sh)
CLEANUP_NODES=("${FAKES[@]}")

fake_nodes "${FAKES[@]}"

start_operator 1
wait_for "operator /readyz" 60 curl -fsS http://127.0.0.1:18081/readyz

# The example's ModelArtifact (the part before its CompiledTarget).
sed '/^---$/q' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null

echo "== a real compile on the real node stores the artifact"
target seed "kubernetes.io/hostname: $REAL"
wait_for "seed compiled" 240 cond_is seed Compiled True Compiled
KEY=$(kubectl -n "$NS" get compiledtarget seed -o jsonpath='{.status.classes[0].compileKey}')

echo "== the fleet target (name over 63 characters) finds the key in the store: no Job"
FLEET=fleet-$(printf 'x%.0s' {1..60})
target "$FLEET" "kiln-e2e/pool: $NS" "rollout: {promoteAtReadyPercent: 60}"
wait_for "fleet compiled" 60 cond_is "$FLEET" Compiled True Compiled
count_is "$FLEET" 0 || die "fleet: $(jobs_of "$FLEET") Jobs, want 0 (cache hit)"
[[ $(kubectl -n "$NS" get compiledtarget "$FLEET" -o jsonpath='{.status.classes[0].compileKey}') == "$KEY" ]] ||
  die "fleet's key differs from seed's"
wait_for "fleet waits for nodes" 30 cond_is "$FLEET" Ready False WaitingForNodes
LABEL="$NS.ready.kiln.dev/t-$(printf %s "$FLEET" | sha256sum | cut -c1-12)"
echo "   readiness label key: $LABEL"

# report NODE PHASE [REASON]: the node's agent reports revision 1 of the fleet target.
report() {
  local reason=${3:+, \"reason\": \"$3\", \"message\": \"$3 on $1 (e2e)\"}
  kubectl apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: KilnNode
metadata: {name: $1}
spec: {}
YAML
  kubectl apply --server-side --field-manager=kiln-agent --subresource=status -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: KilnNode
metadata: {name: $1}
status:
  targets:
    - {"namespace": "$NS", "name": "$FLEET", "revision": 1, "phase": "$2"$reason}
YAML
}
field() { kubectl -n "$NS" get compiledtarget "$FLEET" -o json | jq -r "$1"; }
label_of() { kubectl get node "$1" -o json | jq -r --arg k "$LABEL" '.metadata.labels[$k] // "none"'; }
label_is() { [[ $(label_of "$1") == "$2" ]]; }
field_is() { [[ $(field "$1") == "$2" ]]; }

echo "== reports aggregate per class; ready nodes get the label"
report "${FAKES[0]}" Ready
report "${FAKES[1]}" Failed HashMismatch
report "${FAKES[2]}" Warming
wait_for "label on ${FAKES[0]}" 30 label_is "${FAKES[0]}" 1
wait_for "class row" 30 field_is '.status.classes[0] | "\(.readyNodes) \(.failedNodes) \(.failingNodes | join(",")) \(.reason)"' "1 1 ${FAKES[1]} HashMismatch"
{ label_is "${FAKES[1]}" none && label_is "${FAKES[2]}" none; } || die "labels on failed/warming nodes"
cond_is "$FLEET" Ready False Warming || die "want Ready=False Warming: $(cond "$FLEET" Ready reason)"
[[ $(field '.status.revisions[0].knownGood') == false ]] || die "promoted at 1 of 3"

echo "== 2 of 3 ready (>= 60%): Ready, promoted to knownGood"
report "${FAKES[2]}" Ready
wait_for "Ready=True" 30 cond_is "$FLEET" Ready True Ready
wait_for "knownGood" 30 field_is '.status.revisions[0].knownGood' true
label_is "${FAKES[2]}" 1 || die "no label on ${FAKES[2]}"
echo "   $(cond "$FLEET" Ready message)"
kubectl -n "$NS" get events --field-selector "involvedObject.name=$FLEET" -o json |
  jq -e '[.items[].reason] | index("RevisionPromoted") and index("Ready")' >/dev/null || die "missing Events"

echo "== a node that fails closed loses the label; below the threshold with all settled: Stalled"
report "${FAKES[0]}" Failed ParityExceeded
wait_for "label removed from ${FAKES[0]}" 30 label_is "${FAKES[0]}" none
wait_for "Stalled" 30 cond_is "$FLEET" Stalled True HashMismatch
[[ $(field '.status.classes[0].failingNodes | length') == 2 ]] || die "failingNodes: $(field '.status.classes[0].failingNodes')"
[[ $(field '.status.revisions[0].knownGood') == true ]] || die "knownGood taken back"

echo "== a node serving a fallback keeps its label and degrades the target"
report "${FAKES[0]}" Degraded ParityExceeded
wait_for "Degraded=True" 30 cond_is "$FLEET" Degraded True Fallback
wait_for "label back on ${FAKES[0]}" 30 label_is "${FAKES[0]}" 1

echo "== steady state: no writes"
no_writes_for 8 "at steady state" 1

echo "== metrics"
m=$(curl -fsS http://127.0.0.1:18081/metrics)
grep -q '^kiln_operator_ready_nodes{class="amd64-' <<<"$m" || die "no ready_nodes by class"
grep -q '^kiln_operator_revision_promotions_total 1' <<<"$m" || die "promotion not counted: $(grep promotions <<<"$m")"

echo "== deleting the target removes its labels"
kubectl -n "$NS" delete compiledtarget "$FLEET" >/dev/null
for n in "${FAKES[@]}"; do wait_for "label removed from $n" 30 label_is "$n" none; done
echo "operator-nodes e2e passed"
