#!/usr/bin/env bash
# kiln end to end, installed as README.md's "In a cluster" section says, by running that section's
# block itself (kiln_readme_install: REGISTRY and NAMESPACE set to the cluster's, the options the
# README documents for a plain-HTTP registry and this harness added): scripts/push-images.sh
# builds the operator and agent images and pushes them to the cluster's registry, the chart is
# installed with them pinned by digest and the kubelet pulls them from there (nothing loaded by
# hand), with the store on the same registry; the README applies the example. A serving pod gated
# on kiln.dev/warm (created right after) becomes Ready only after the KilnNode row (checked while
# polling and on the API timestamps): the compile Job pushes the artifact to the registry; the
# agent pulls it by digest, verifies, loads, warms and reports its KilnNode row Ready; the node
# readiness label appears; both components' metrics show the path and pass promtool. Prints the
# time from apply to ready. Then one byte of
# the artifact blob is flipped in the registry's storage and the agent restarts on a fresh cache
# (helm upgrade): the pull fails verification (HashMismatch), the node fails closed (row Failed,
# gate False with the reason, pod not Ready, label removed), counted, and nothing is loaded.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
ensure_busybox
kiln_test kiln
TARGET=squeezenet-cpu
LABEL="$NS.ready.kiln.dev/$TARGET"
BLOB=
teardown() {
  # The registry's blobs are shared by every repository: put the flipped byte back.
  [[ -z $BLOB ]] || flip "$BLOB"
  kubectl label node "$REAL" "$LABEL-" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$NS-elsewhere" --ignore-not-found >/dev/null 2>&1 || true
}
epoch() { date -d "$1" +%s; }

kiln_example_dirs "$WORK"

echo "== README.md's cluster install: images pushed to $REGISTRY_ADDR, chart, example"
kiln_fresh_crds
# The README's block creates the namespace and names the release kiln.
kubectl delete namespace "$NS" --wait=true --timeout=120s >/dev/null
REL=kiln
IMAGES=$REGISTRY_ADDR/kiln-e2e/$NS
kiln_readme_install "$WORK" "$IMAGES" "$NS" \
  "--plain-http --images operator,agent,csi --operator-bin $(bin kiln-operator) --agent-bin $(bin kiln-agent) --csi-bin $(bin kiln-csi)" \
  "--set store.insecure=true --set sources.hostPath=$WORK/sources --set agent.cacheHostPath=$WORK/cache --set compile.retryBackoffSeconds=2 --set csi.kubeletDir=$KUBELET_DIR" ||
  die "README.md's cluster commands failed"
T_APPLY=$(date +%s.%N)
STORE=$(kubectl -n "$NS" get deploy kiln-operator -o json |
  jq -r '.spec.template.spec.containers[0].env[] | select(.name == "KILN_STORE") | .value')
[[ $STORE == "oci://$REGISTRY_ADDR/"* ]] || die "the README's store is $STORE, not on the cluster's registry"
REPOSITORY=${STORE#"oci://$REGISTRY_ADDR/"}

echo "== the kubelet pulled the pushed images by digest"
VALUES=$WORK/readme/kiln-images.yaml
for c in operator agent; do
  want=$(python3 -c 'import sys, yaml; i = yaml.safe_load(open(sys.argv[1]))[sys.argv[2]]["image"]; print(i["repository"] + "@" + i["digest"])' "$VALUES" "$c")
  [[ $want == "$IMAGES/$c@sha256:"* ]] || die "kiln-images.yaml pins $c as $want"
  pod=$(kubectl -n "$NS" get pods -l "app.kubernetes.io/component=$c" -o json)
  jq -e --arg w "$want" '[.items[] | .spec.containers[0].image == $w and .status.containerStatuses[0].imageID == $w] | all and length > 0' <<<"$pod" >/dev/null ||
    die "$c pods do not run $want: $(jq -c '[.items[] | {image: .spec.containers[0].image, imageID: .status.containerStatuses[0].imageID}]' <<<"$pod")"
  kubectl -n "$NS" get events --field-selector reason=Pulled -o json |
    jq -e --arg w "$want" 'any(.items[]; .message | contains("Successfully pulled image \"" + $w + "\""))' >/dev/null ||
    die "no 'Successfully pulled image' event for $want"
  echo "   $c: $want pulled from the registry"
done

echo "== a serving pod gated on kiln.dev/warm"
serving_pod "$NS" "$TARGET" "$REAL"

row() { kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq -c --arg ns "$NS" --arg t "$TARGET" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
pod_ready() { kubectl -n "$NS" get pod serve -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
# Poll both until the pod is Ready; the pod must never be Ready while the row is not. The pod is
# read first: the row turns Ready before the gate, so a row read after a Ready pod must be Ready
# (read the other way round, the row could turn Ready and the gate True between the two reads).
seen_not_ready=0 t_row='' t_pod=''
end=$((SECONDS + 300))
while ((SECONDS < end)); do
  ready=$(pod_ready)
  phase=$(row | jq -r '.phase // empty')
  now=$(date +%s.%N)
  [[ $phase == Ready && -z $t_row ]] && t_row=$now
  if [[ $ready == True ]]; then
    [[ -n $t_row ]] || die "serving pod Ready while the KilnNode row is ${phase:-absent}"
    t_pod=$now; break
  fi
  [[ -n $ready ]] && seen_not_ready=1
  [[ $phase == Failed ]] && die "KilnNode row Failed: $(row)"
  sleep 0.5
done
[[ -n $t_pod ]] || die "serving pod not Ready within 300s (row: $(row))"
((seen_not_ready)) || die "the serving pod was never seen not Ready: the ordering proves nothing"
ROW=$(row)
warm=$(kubectl -n "$NS" get pod serve -o json | jq -c '.status.conditions[] | select(.type == "kiln.dev/warm")')
[[ $(jq -r .status <<<"$warm") == True ]] || die "kiln.dev/warm: $warm"
ready_since=$(jq -r .readySince <<<"$ROW")
pod_ready_at=$(kubectl -n "$NS" get pod serve -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
(($(epoch "$pod_ready_at") >= $(epoch "$ready_since"))) || die "pod Ready at $pod_ready_at before the row's readySince $ready_since"
echo "   row Ready since $ready_since; kiln.dev/warm True at $(jq -r .lastTransitionTime <<<"$warm"); pod Ready at $pod_ready_at"

echo "== the artifact in the registry is what the node verified"
CT=$(kubectl -n "$NS" get compiledtarget "$TARGET" -o json)
KEY=$(jq -r '.status.classes[0].compileKey' <<<"$CT")
DIGEST=$(jq -r '.status.classes[0].artifactDigest' <<<"$CT")
[[ $(jq -r .artifactDigest <<<"$ROW") == *"$DIGEST" ]] || die "node verified $(jq -r .artifactDigest <<<"$ROW"), target says $DIGEST"
manifest=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$KEY") ||
  die "no manifest tagged $KEY in $REPOSITORY"
jq -e --arg d "sha256:$DIGEST" '.artifactType == "application/vnd.kiln.artifact.v1" and .layers[0].digest == $d' <<<"$manifest" >/dev/null ||
  die "registry manifest: $manifest"
echo "   $REPOSITORY:${KEY:0:12}… layer sha256:${DIGEST:0:12}… pulled $(jq -r .pullBytes <<<"$ROW") bytes"
# Signed provenance beside it, tagged as cosign tags attestations, naming key and digests.
MDIGEST=$(jq -r '.status.classes[0].manifestDigest' <<<"$CT")
att=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
  "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/${MDIGEST/:/-}.att") || die "no attestation tagged ${MDIGEST/:/-}.att"
envelope=$(curl -fsS "http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/$(jq -r '.layers[0].digest' <<<"$att")") || die "attestation blob"
jq -e --arg k "$KEY" --arg d "$DIGEST" '.payloadType == "application/vnd.in-toto+json" and (.signatures | length) == 1
  and (.payload | @base64d | fromjson | .predicate.buildDefinition.externalParameters.compileKey == $k
  and any(.subject[]; .digest.sha256 == $d))' <<<"$envelope" >/dev/null || die "attestation: $envelope"
echo "   attestation ${MDIGEST/:/-}.att: in-toto statement for ${KEY:0:12}…, one signature"
# The tool platform teams check attestations with, on the entry the compile Job pushed: the real
# cosign (scripts/ensure/cosign.sh), given the chart's public key.
kubectl -n "$NS" get secret kiln-signing -o jsonpath='{.data.signing\.pub}' | base64 -d >"$WORK/signing.pub"
cosign=$("$REPO/scripts/ensure/cosign.sh") || die "cosign could not be built (scripts/ensure/cosign.sh)"
HOME=$WORK "$cosign" verify-attestation --key "$WORK/signing.pub" --type slsaprovenance1 \
  --insecure-ignore-tlog=true --allow-http-registry "$REGISTRY_ADDR/$REPOSITORY@$MDIGEST" \
  >"$WORK/cosign.out" 2>"$WORK/cosign.err" || die "cosign verify-attestation refused the entry: $(cat "$WORK/cosign.err")"
grep -q "The cosign claims were validated" "$WORK/cosign.err" || die "cosign said: $(cat "$WORK/cosign.err")"
echo "   cosign verify-attestation --type slsaprovenance1: verified with the chart's signing.pub"

echo "== the agent's token writes only its own node's objects (ValidatingAdmissionPolicy)"
# The agent above already wrote its KilnNode and its pods' gates under the policy. A token bound to
# its pod, as the kubelet mounts it, is refused for another node's KilnNode and for a pod on
# another node, with the policy's message; a token not bound to a pod writes nothing.
agent_pod=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}')
bound=$(kubectl -n "$NS" create token kiln-agent --bound-object-kind Pod --bound-object-name "$agent_pod" \
  --bound-object-uid "$(kubectl -n "$NS" get pod "$agent_pod" -o jsonpath='{.metadata.uid}')")
unbound=$(kubectl -n "$NS" create token kiln-agent)
kubectl apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: KilnNode
metadata: {name: $NS-elsewhere}
spec: {}
YAML
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: elsewhere}
spec: {nodeName: $NS-elsewhere, containers: [{name: c, image: $BUSYBOX_IMAGE}]}
YAML
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/ca.crt"
# as_agent TOKEN PATH BODY: a status merge-patch as the agent; prints the HTTP code and message.
as_agent() {
  curl -sS --cacert "$WORK/ca.crt" -H "Authorization: Bearer $1" -X PATCH \
    -H 'Content-Type: application/merge-patch+json' "$server$2" -d "$3" |
    jq -r '"\(.code // 200) \(.message // "")"'
}
out=$(as_agent "$bound" "/apis/kiln.dev/v1alpha1/kilnnodes/$NS-elsewhere/status" '{"status":{"targets":[]}}')
[[ $out == "422 "*"may write only KilnNode $REAL, not $NS-elsewhere"* ]] || die "another node's KilnNode: $out"
out=$(as_agent "$bound" "/api/v1/namespaces/$NS/pods/elsewhere/status" '{"status":{"conditions":[{"type":"kiln.dev/warm","status":"True"}]}}')
[[ $out == "422 "*"may write only pods on that node"* ]] || die "a pod on another node: $out"
out=$(as_agent "$unbound" "/apis/kiln.dev/v1alpha1/kilnnodes/$REAL/status" '{"status":{}}')
[[ $out == "422 "*"token bound to its pod"* ]] || die "unbound token: $out"
out=$(as_agent "$bound" "/apis/kiln.dev/v1alpha1/kilnnodes/$REAL/status" '{"status":{}}')
[[ $out == "200 "* ]] || die "own KilnNode refused: $out"
kubectl delete kilnnode "$NS-elsewhere" >/dev/null
kubectl -n "$NS" delete pod elsewhere --wait=false >/dev/null
echo "   refused: KilnNode $NS-elsewhere, pod on $NS-elsewhere, an unbound token; allowed: KilnNode $REAL"

echo "== node readiness label"
label() { kubectl get node "$REAL" -o json | jq -er --arg l "$LABEL" '.metadata.labels[$l] // empty'; }
wait_for "label $LABEL" 60 label
[[ $(label) == "$(jq -r .revision <<<"$ROW")" ]] || die "label $LABEL=$(label), row revision $(jq -r .revision <<<"$ROW")"
echo "   $LABEL=$(label)"

echo "== metrics show the path (and pass promtool)"
agent_m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics") || die "agent /metrics"
op_m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-operator-metrics:metrics/proxy/metrics") || die "operator /metrics"
promtool check metrics <<<"$agent_m" || die "promtool rejects the agent's exposition"
promtool check metrics <<<"$op_m" || die "promtool rejects the operator's exposition"
positive() { awk -v re="^$1" '$0 ~ re {s += $NF} END {exit !(s > 0)}' <<<"$2" || die "no positive $1 in /metrics"; }
positive 'kiln_operator_compile_jobs_total\{[^}]*result="succeeded"' "$op_m"
grep -qx "kiln_operator_untrusted_entries_total 0" <<<"$op_m" || die "operator refused stored entries"
positive kiln_agent_artifact_pull_bytes "$agent_m"
positive kiln_agent_load_seconds_count "$agent_m"
positive kiln_agent_warmup_seconds_count "$agent_m"
positive kiln_agent_target_ready "$agent_m"

echo "== an entry rewritten in the registry is refused by the operator and rebuilt, signed"
# Someone with push access (but not the signing key) retags the compile key to another manifest
# (here the same layers with one more annotation: every digest in it is consistent). A running
# operator remembers the entry it verified (operator/src/recall/lookups.rs: nodes keep pulling that
# digest) until a node reports the entry broken or it restarts; restarted here, it looks the key
# up again, refuses the unsigned entry, a compile Job rebuilds and re-signs the key, and the
# node keeps serving what it verified.
OCI_MT=application/vnd.oci.image.manifest.v1+json
tag_digest() {
  curl -fsSI -H "Accept: $OCI_MT" "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$KEY" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}'
}
forged=$(curl -fsS -H "Accept: $OCI_MT" "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$KEY" |
  jq -c '.annotations["dev.kiln.forged"] = "yes"')
curl -fsS -X PUT -H "Content-Type: $OCI_MT" --data-binary "$forged" \
  "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$KEY" >/dev/null || die "retagging $KEY"
FORGED=$(tag_digest)
[[ $FORGED != "$MDIGEST" ]] || die "the retag did not move $KEY"
kubectl -n "$NS" rollout restart deploy/kiln-operator >/dev/null || die "restarting the operator"
kubectl -n "$NS" rollout status deploy/kiln-operator --timeout=120s >/dev/null || die "operator not back"
op_metric() {
  kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-operator-metrics:metrics/proxy/metrics" |
    awk -v m="$1" '$1 == m {print $2}'
}
refused() { (($(op_metric kiln_operator_untrusted_entries_total) > 0)); }
wait_for "operator refuses the rewritten entry" 120 refused
signed_again() {
  local d
  d=$(tag_digest) && [[ $d != "$FORGED" ]] &&
    curl -fsS -o /dev/null -H "Accept: $OCI_MT" "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/${d/:/-}.att"
}
wait_for "$KEY rebuilt and signed again" 240 signed_again
[[ $(curl -fsS -H "Accept: $OCI_MT" "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$KEY" | jq -r '.layers[0].digest') == "sha256:$DIGEST" ]] ||
  die "the rebuild produced another artifact than sha256:$DIGEST"
[[ $(row | jq -r .phase) == Ready ]] || die "the node stopped serving: $(row)"
echo "   retagged to ${FORGED:7:12}…, refused, rebuilt as ${DIGEST:0:12}… and signed; node stayed Ready"

echo "== a flipped byte in the registry's blob, fresh node cache: HashMismatch, fail closed"
BLOB_PATH=$REGISTRY_DIR/docker/registry/v2/blobs/sha256/${DIGEST:0:2}/$DIGEST/data
[[ -f $BLOB_PATH ]] || die "no blob at $BLOB_PATH"
flip "$BLOB_PATH"
BLOB=$BLOB_PATH
[[ $(curl -fsS "http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/sha256:$DIGEST" | sha256sum | cut -d' ' -f1) != "$DIGEST" ]] ||
  die "the registry still serves the original bytes"
OLD_AGENT=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}')
install -d -m 755 "$WORK/cache2"
helm upgrade "$REL" "$REPO/charts/kiln" -n "$NS" --reuse-values --set agent.cacheHostPath="$WORK/cache2" >/dev/null ||
  die "helm upgrade failed"
kubectl -n "$NS" rollout status ds/kiln-agent --timeout=120s >/dev/null || die "upgraded agent not ready"
kubectl -n "$NS" get pod "$OLD_AGENT" >/dev/null 2>&1 && kubectl -n "$NS" wait --for=delete "pod/$OLD_AGENT" --timeout=60s >/dev/null
row_failed() { [[ $(row | jq -r '"\(.phase) \(.reason)"') == "Failed HashMismatch" ]]; }
wait_for "row Failed HashMismatch" 120 row_failed
warm_false() {
  kubectl -n "$NS" get pod serve -o json |
    jq -e '(.status.conditions[] | select(.type == "kiln.dev/warm") | .status == "False" and .reason == "HashMismatch")
      and (.status.conditions[] | select(.type == "Ready") | .status == "False")'
}
wait_for "gate False/HashMismatch and pod not Ready" 60 warm_false
no_label() { ! label; }
wait_for "label $LABEL removed" 60 no_label
tampered_m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics") || die "agent /metrics"
positive 'kiln_agent_verify_failures_total\{reason="HashMismatch"' "$tampered_m"
positive 'kiln_agent_fail_closed_total\{reason="HashMismatch"' "$tampered_m"
awk '/^kiln_agent_load_seconds_count/ {s += $NF} END {exit s != 0}' <<<"$tampered_m" || die "the tampered artifact was loaded"
[[ -z $(find "$WORK/cache2" -type f -size +1M) ]] || die "a corrupt artifact is in the fresh cache: $(find "$WORK/cache2" -type f -size +1M)"
echo "   $(row | jq -r .message | cut -c1-150)…"

seen_to_ready=$(awk '/^kiln_agent_revision_ready_seconds_sum/ {print $2}' <<<"$agent_m")
printf 'apply -> serving pod Ready: %.1fs; agent: revision seen -> ready %.2fs (pull %.3fs, load %.3fs, warmup %.3fs)\n' \
  "$(awk "BEGIN {print $t_pod - $T_APPLY}")" "$seen_to_ready" "$(jq -r .pullSeconds <<<"$ROW")" \
  "$(jq -r .loadSeconds <<<"$ROW")" "$(jq -r .warmupSeconds <<<"$ROW")"
echo "kiln passed"
