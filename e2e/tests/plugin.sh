#!/usr/bin/env bash
# kubectl kiln on the real cluster, installed as krew installs a plugin (the binary copied onto
# PATH, run as `kubectl kiln`): kiln installed by its chart with the store on the cluster's
# registry, the example target served by the node with a serving pod gated on it, then a second
# revision. `status` and `why` (tables and -o json) agree with the objects and exit 0 only when
# Ready; `history` lists both revisions, newest first, known-good, with when they were recorded and
# the node serving the current one; `rollback --wait` pins revision 1 under its own field manager
# and returns once the node serves it (its time is printed; the artifact is in the node cache, so
# no Job is created and the serving pod never loses readiness); `unpin` hands serving back to
# revision 2; a revision not in history is refused, and so is a pin another field manager (a
# GitOps tool) applied, naming it. A target that cannot be
# served (its model missing) makes `status` exit 1 and `why` name the Stalled condition.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
source "$(dirname "$0")/observe-lib.sh"
ensure_busybox
kiln_test plugin
TARGET=squeezenet-cpu
teardown() { watch_stop; }

# Installed the krew way: the binary on PATH, found by kubectl as `kubectl kiln`.
mkdir -p "$WORK/bin"
cp "$(bin kubectl-kiln)" "$WORK/bin/kubectl-kiln"
export PATH=$WORK/bin:$PATH
kubectl plugin list 2>/dev/null | grep -c "$WORK/bin/kubectl-kiln" >/dev/null || die "kubectl does not list the plugin"
for sub in status history rollback unpin why; do
  kubectl kiln "$sub" --help | grep -c -- '--namespace' >/dev/null || die "kubectl kiln $sub --help"
done

kiln_images "$WORK"
kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"

# revise PROFILE: the example target with another profile name (a new compile key: a new revision).
revise() { example_target "$TARGET" "$1" | kubectl -n "$NS" apply -f - >/dev/null; }
ct() { kubectl -n "$NS" get compiledtarget "$TARGET" -o json; }
gate() { kubectl -n "$NS" get pod serve -o json | jq -r '.status.conditions[]? | select(.type == "kiln.dev/warm") | .status'; }
# known_good N: revision N is recorded known-good and the node's row serves the current revision.
known_good() {
  ct | jq -e --argjson n "$1" '.status.revision == $n and any(.status.revisions[]; .number == $n and .knownGood)' >/dev/null
}

echo "== the example served, then a second revision"
awk '/^---/ {exit} /^apiVersion/ {on = 1} on' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null || die "apply model"
revise a
serving_pod "$NS" "$TARGET" "$REAL"
wait_for "revision 1 known-good" 300 known_good 1
wait_for "pod gate True" 60 bash -c "[[ \$(kubectl -n $NS get pod serve -o json | jq -r '.status.conditions[]? | select(.type == \"kiln.dev/warm\") | .status') == True ]]"
revise b
wait_for "revision 2 known-good" 300 known_good 2
wait_for "the node serves revision 2" 60 kubectl kiln -n "$NS" status "$TARGET"

echo "== status"
out=$(kubectl kiln -n "$NS" status "$TARGET") || die "status exited $? on a Ready target: $out"
grep -q "^$NS/$TARGET: Ready (revision 2)" <<<"$out" || die "status: $out"
grep -q "^$REAL .* Ready .* 2 " <<<"$out" || die "status has no Ready row of $REAL on revision 2: $out"
sed 's/^/   | /' <<<"$out"
json=$(kubectl kiln -n "$NS" status "$TARGET" -o json)
jq -e --arg n "$REAL" '.ready and .revision == 2 and (.nodes | length) == 1 and .nodes[0].node == $n and
  .nodes[0].phase == "Ready" and .nodes[0].loadSeconds > 0 and (.classes | length) == 1 and
  .classes[0].readyNodes == 1' <<<"$json" >/dev/null || die "status -o json: $json"
kubectl kiln -n "$NS" status "$TARGET" -o yaml | grep -c '^ready: true' >/dev/null || die "status -o yaml"
# The kubeconfig flag and the context's namespace as kubectl users expect.
cp "$KUBECONFIG" "$WORK/kubeconfig"
KUBECONFIG=/nonexistent kubectl kiln --kubeconfig "$WORK/kubeconfig" -n "$NS" status "$TARGET" >/dev/null ||
  die "--kubeconfig"
kubectl --kubeconfig "$WORK/kubeconfig" config set-context --current --namespace "$NS" >/dev/null
KUBECONFIG=$WORK/kubeconfig kubectl kiln status "$TARGET" >/dev/null || die "the context's namespace is not the default"

echo "== history"
hist=$(kubectl kiln -n "$NS" history "$TARGET" -o json)
jq -e --arg n "$REAL" '[.[].number] == [2, 1] and all(.[]; .knownGood and .createdAt != null) and
  .[0].current and .[0].servedBy == [$n] and .[1].servedBy == [] and
  (.[0].artifacts[0].digest != .[1].artifacts[0].digest)' <<<"$hist" >/dev/null || die "history: $hist"
out=$(kubectl kiln -n "$NS" history "$TARGET")
grep -q "^2\*" <<<"$out" || die "history table: $out"
sed 's/^/   | /' <<<"$out"

echo "== rollback refusals"
err=$(kubectl kiln -n "$NS" rollback "$TARGET" --to 7 2>&1) && die "rollback to a revision not in history: $err"
grep -q "not in the target's history" <<<"$err" || die "rollback --to 7: $err"

echo "== rollback --wait (artifact in the node cache)"
JOBS=/apis/batch/v1/namespaces/$NS/jobs
collection_rv jobs_rv "$JOBS"
# The serving pod's readiness through the rollback: a watch that begins with its state.
watch_object "$WORK/serve.watch" "/api/v1/namespaces/$NS/pods" serve
rb=$(kubectl kiln -n "$NS" rollback "$TARGET" --wait -o json) || die "rollback: $rb"
jq -e '.pinnedRevision == 1 and .servedAfterSeconds > 0' <<<"$rb" >/dev/null || die "rollback -o json: $rb"
echo "   every node serves revision 1, Ready, $(jq -r '.servedAfterSeconds * 1000 | round' <<<"$rb") ms after the pin"
ct | jq -e '.spec.rollout.pinnedRevision == 1' >/dev/null || die "no pin in the spec"
kubectl -n "$NS" get compiledtarget "$TARGET" -o json --show-managed-fields |
  jq -e '[.metadata.managedFields[] | select(.manager == "kubectl-kiln") | .fieldsV1."f:spec"."f:rollout"."f:pinnedRevision"] | length == 1' >/dev/null ||
  die "the pin is not owned by field manager kubectl-kiln"
[[ $(kubectl kiln -n "$NS" status "$TARGET" -o json | jq -r '.nodes[0].revision') == 1 ]] || die "status does not show revision 1 served"
# Every state of the pod from before the pin to now: Ready True in each.
ready_never_false "$WORK/serve.watch" "/api/v1/namespaces/$NS/pods" serve
[[ $(gate) == True ]] || die "gate $(gate) after the rollback"
# Every Job created since before the pin, and for 1 s more: none.
# shellcheck disable=SC2154 # jobs_rv: set by collection_rv
assert_no_events_since "$JOBS" "$jobs_rv" 1 "Jobs created by the rollback" '.type == "ADDED"'

echo "== unpin"
kubectl kiln -n "$NS" unpin "$TARGET" >/dev/null || die "unpin"
ct | jq -e '.spec.rollout.pinnedRevision == null' >/dev/null || die "the pin stayed: $(ct | jq -c .spec.rollout)"
wait_for "the node serves revision 2 again" 60 kubectl kiln -n "$NS" status "$TARGET"

echo "== a pin another field manager applied (a GitOps tool) is not taken over"
example_target "$TARGET" b 5 "{pinnedRevision: 2}" |
  kubectl -n "$NS" apply --server-side --field-manager=gitops -f - >/dev/null || die "gitops apply"
err=$(kubectl kiln -n "$NS" rollback "$TARGET" --to 1 2>&1) && die "rollback took the field from gitops: $err"
grep -q 'gitops' <<<"$err" && grep -q 'change it where that manager applies it' <<<"$err" || die "conflict message: $err"
ct | jq -e '.spec.rollout.pinnedRevision == 2' >/dev/null || die "the GitOps pin moved"

echo "== why"
out=$(kubectl kiln -n "$NS" why "$TARGET") || die "why on a Ready target exited $?: $out"
grep -q "nothing wrong" <<<"$out" || die "why: $out"
kubectl kiln why "node/$REAL" >/dev/null || die "why node/$REAL: $(kubectl kiln why "node/$REAL")"
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: orphan}
spec:
  modelRef: {name: no-such-model}
  backend: {kind: tract}
  profiles: [{name: a, dims: {batch: 1}}]
  warmup: {fixtureVersion: v1}
YAML
stalled() { kubectl -n "$NS" get compiledtarget orphan -o json | jq -e '.status.conditions[]? | select(.type == "Stalled" and .status == "True")' >/dev/null; }
wait_for "orphan Stalled" 60 stalled
kubectl kiln -n "$NS" status orphan >/dev/null && die "status exited 0 on a Stalled target"
why=$(kubectl kiln -n "$NS" why target/orphan -o json) && die "why exited 0 on a Stalled target"
jq -e '.ready == false and any(.problems[]; .at == "condition Stalled=True" and (.message | contains("no-such-model")))' <<<"$why" >/dev/null ||
  die "why orphan: $why"
echo "   why orphan: $(jq -r '.problems[0] | "\(.at): \(.message)"' <<<"$why" | cut -c1-160)"
