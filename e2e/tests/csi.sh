#!/usr/bin/env bash
# The CSI node plugin csi.kiln.dev on the real kubelet: kiln installed by its chart (CSIDriver,
# the kiln-csi DaemonSet with its own get-only account) with the store on the cluster's registry.
# Asserts: the plugin registers itself with the kubelet (its own registration socket, no
# node-driver-registrar), so the node's CSINode lists csi.kiln.dev; a serving pod in a namespace
# enforcing Pod Security `restricted` (a hostPath pod is refused there) with the inline volume
# (readOnly, volumeAttributes {target}) stays ContainerCreating while the node's row is not Ready,
# the kubelet's FailedMount Event naming the reason, and starts once the row is Ready (never
# before: polled, and checked on the timestamps); inside it the files are there, read-only
# (writing fails), kiln.json names the row's revision and digest, and `sha256sum artifact` is the
# row's digest; a pod whose target does not exist gets the refusal Event; the plugin SIGKILLed
# (pod deleted) while the kubelet retries a publish comes back, registers again, and the pod
# mounts; deleting the pods unmounts (nothing left under published/, no mount under the kubelet's
# pods directory). Prints the publish latency (the hash included) from the plugin's log.
#
# The target lives in the serving namespace SERVE (a volume's target is looked up in the pod's
# namespace), apart from the release's namespace, where the privileged plugin runs; SERVE gets
# the compile Jobs' account and the signing Secret, as a user's serving namespace would. The
# compile Job reads the example's sources from a hostPath (the only way a model reaches this
# offline cluster), which `restricted` forbids, so SERVE is labelled once the compile is done;
# with https:// sources a compile Job meets `restricted` (operator/src/job/mod.rs).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
ensure_busybox
kiln_test csi
TARGET=squeezenet-cpu
SERVE=$NS-serve
teardown() {
  kubectl -n "$SERVE" delete pod --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$SERVE" delete compiledtarget --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete namespace "$SERVE" --wait=false >/dev/null 2>&1 || true
  kubectl label node "$REAL" "$SERVE.ready.kiln.dev/$TARGET-" >/dev/null 2>&1 || true
}
# csi_pod: the plugin's pod (not one being deleted).
csi_pod() {
  kubectl -n "$NS" get pod -l app.kubernetes.io/component=csi -o json |
    jq -r '[.items[] | select(.metadata.deletionTimestamp == null) | .metadata.name] | first // empty'
}
csi_logs() { kubectl -n "$NS" logs "$(csi_pod)" 2>/dev/null; }
die() {
  csi_logs | tail -20 >&2 || true
  dump "$SERVE" >&2
  kiln_diagnose "$NS" "$REAL"
  fail "$*"
}

kiln_images "$WORK"
kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"
kubectl -n "$NS" rollout status ds/kiln-csi --timeout=120s >/dev/null || die "kiln-csi not ready"

echo "== the plugin registers with the kubelet"
registered() { kubectl get csinode "$REAL" -o json | jq -e '.spec.drivers // [] | any(.name == "csi.kiln.dev" and .nodeID == "'"$REAL"'")'; }
wait_for "CSINode $REAL lists csi.kiln.dev" 60 registered
kubectl get csidriver csi.kiln.dev -o json | jq -e '.spec | .attachRequired == false and .podInfoOnMount == true
  and .volumeLifecycleModes == ["Ephemeral"] and .fsGroupPolicy == "None"' >/dev/null || die "CSIDriver spec"
can() { kubectl auth can-i "$@" --as "system:serviceaccount:$NS:kiln-csi" 2>/dev/null || true; }
[[ $(can list kilnnodes) == no && $(can get kilnnodes) == yes && $(can patch kilnnodes/status) == no ]] ||
  die "kiln-csi's account may do more than get KilnNodes"
kubectl -n "$NS" get ds kiln-agent -o json | jq -e '.spec.template.spec.containers[0].securityContext.privileged != true' >/dev/null ||
  die "the engine-running agent is privileged"
echo "   CSINode $REAL: $(kubectl get csinode "$REAL" -o json | jq -c '[.spec.drivers[].name]'); kiln-csi may only get KilnNodes"

echo "== the example compiled in the serving namespace; its warmup long enough to be seen"
kubectl create namespace "$SERVE" >/dev/null
kubectl -n "$SERVE" create serviceaccount kiln-compile >/dev/null
kubectl -n "$NS" get secret kiln-signing -o json |
  jq '{apiVersion, kind, type, data, metadata: {name: .metadata.name}}' | kubectl -n "$SERVE" apply -f - >/dev/null
python3 -c 'import sys, yaml; [print("---\n" + yaml.safe_dump(d)) for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ModelArtifact"]' \
  "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$SERVE" apply -f - >/dev/null
# 2,000 warmup iterations: the row is Warming for tens of seconds after the compile.
example_target "$TARGET" batch1 2000 | kubectl -n "$SERVE" apply -f - >/dev/null
compiled() { kubectl -n "$SERVE" get compiledtarget "$TARGET" -o json | jq -e '(.status.classes[0].artifactDigest // "") != ""'; }
wait_for "the target compiled" 300 compiled
kubectl label namespace "$SERVE" pod-security.kubernetes.io/enforce=restricted >/dev/null
refused_hostpath=$(kubectl -n "$SERVE" apply -f - 2>&1 <<YAML || true
apiVersion: v1
kind: Pod
metadata: {name: hostpath}
spec:
  containers: [{name: c, image: $BUSYBOX_IMAGE}]
  volumes: [{name: h, hostPath: {path: /}}]
YAML
)
[[ $refused_hostpath == *"violates PodSecurity \"restricted"* ]] || die "restricted not enforced: $refused_hostpath"

# model_pod NAME TARGET: a restricted-compliant pod on the node with the kiln volume at /model.
model_pod() {
  kubectl -n "$SERVE" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeName: $REAL
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: serve
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: [sleep, "3600"]
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: model, mountPath: /model, readOnly: true}]
  volumes:
    - name: model
      csi: {driver: csi.kiln.dev, readOnly: true, volumeAttributes: {target: $2}}
YAML
}
row() { kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq -c --arg ns "$SERVE" --arg t "$TARGET" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
phase_of() { kubectl -n "$SERVE" get pod "$1" -o jsonpath='{.status.phase}'; }
# mount_events POD: the kubelet's FailedMount messages for the pod.
mount_events() {
  kubectl -n "$SERVE" get events --field-selector "involvedObject.name=$1,reason=FailedMount" -o json | jq -r '.items[].message'
}

echo "== a serving pod in the restricted namespace waits for the row, then mounts"
model_pod serve "$TARGET"
model_pod nothing absent
seen_refusal='' t_row='' t_run=''
end=$((SECONDS + 450))
while ((SECONDS < end)); do
  running=$(phase_of serve)
  phase=$(row | jq -r '.phase // empty')
  now=$(date +%s.%N)
  [[ $phase == Ready && -z $t_row ]] && t_row=$now
  if [[ $running == Running ]]; then
    [[ -n $t_row ]] || die "serving pod Running while the KilnNode row is ${phase:-absent}"
    t_run=$now; break
  fi
  [[ -z $seen_refusal ]] && seen_refusal=$(mount_events serve | grep -m1 'not mounted until it is Ready' || true)
  sleep 0.5
done
[[ -n $t_run ]] || die "serving pod not Running within 450s (row: $(row); events: $(mount_events serve | tail -1))"
[[ -n $seen_refusal ]] || die "no FailedMount Event naming the reason before the row was Ready: the ordering proves nothing"
echo "   refused first: ${seen_refusal:0:220}"
ROW=$(row)
started=$(kubectl -n "$SERVE" get pod serve -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')
(($(date -d "$started" +%s) >= $(date -d "$(jq -r .readySince <<<"$ROW")" +%s))) ||
  die "the container started at $started, before the row's readySince $(jq -r .readySince <<<"$ROW")"

echo "== inside the pod: the verified bytes, read-only"
DIGEST=$(jq -r .artifactDigest <<<"$ROW")
in_pod() { kubectl -n "$SERVE" exec serve -- "$@"; }
files=$(in_pod ls /model | sort | tr '\n' ' ')
[[ $files == "artifact fixture.safetensors kiln.json manifest.json " ]] || die "files in /model: $files"
[[ $(in_pod sha256sum /model/artifact | cut -d' ' -f1) == "$DIGEST" ]] || die "sha256sum artifact is not the row's $DIGEST"
info=$(in_pod cat /model/kiln.json)
jq -e --arg d "$DIGEST" --argjson r "$(jq .revision <<<"$ROW")" --arg n "$REAL" --arg ns "$SERVE" --arg t "$TARGET" \
  '.digest == $d and .revision == $r and .node == $n and .namespace == $ns and .target == $t
   and .pod == $ns + "/serve" and (.fixture | length) == 64' <<<"$info" >/dev/null || die "kiln.json: $info"
fixture_sha=$(kubectl -n "$SERVE" get modelartifact squeezenet -o jsonpath='{.spec.fixtures[0].sha256}')
[[ $(in_pod sha256sum /model/fixture.safetensors | cut -d' ' -f1) == "$fixture_sha" ]] || die "fixture is not $fixture_sha"
written=$(in_pod sh -c 'echo x > /model/x; echo x >> /model/artifact' 2>&1 || true)
[[ $written == *"Read-only file system"* ]] || die "writing into /model: $written"
SIZE=$(in_pod wc -c /model/artifact | awk '{print $1}')
echo "   $files; sha256 ${DIGEST:0:16}… = row; revision $(jq .revision <<<"$ROW"); writes refused (read-only)"

echo "== a pod whose target does not exist: refused, saying so"
[[ $(phase_of nothing) == Pending ]] || die "pod 'nothing' is $(phase_of nothing)"
absent() { mount_events nothing | grep -q "CompiledTarget $SERVE/absent has no row on node $REAL"; }
wait_for "the refusal Event of pod 'nothing'" 60 absent
echo "   $(mount_events nothing | grep -m1 'has no row' | cut -c1-200)…"

echo "== the plugin SIGKILLed while the kubelet retries a publish: back, registered, mounted"
kubectl -n "$SERVE" delete pod nothing --wait=true --timeout=60s >/dev/null
model_pod again "$TARGET"
old=$(csi_pod)
kill -KILL "$(pgrep -f '^/bin/kiln-csi')" || die "no plugin process"
kubectl -n "$NS" delete pod "$old" --wait=false >/dev/null
back() {
  kubectl -n "$NS" get pod -l app.kubernetes.io/component=csi -o json |
    jq -e --arg old "$old" '[.items[] | select(.metadata.name != $old and .status.phase == "Running")] | length == 1'
}
wait_for "a new plugin pod" 120 back
wait_for "CSINode lists csi.kiln.dev again" 60 registered
again_running() { [[ $(phase_of again) == Running ]]; }
wait_for "pod 'again' Running" 120 again_running
[[ $(kubectl -n "$SERVE" exec again -- sha256sum /model/artifact | cut -d' ' -f1) == "$DIGEST" ]] || die "pod 'again' has other bytes"
echo "   plugin $old killed, $(csi_pod) registered, pod 'again' mounted ${DIGEST:0:16}…"

echo "== deleting the pods unmounts; nothing left"
KUBELET_PODS=$STATE/kubelet/root/pods
kubectl -n "$SERVE" delete pod serve again --wait=true --timeout=60s >/dev/null || die "pods not deleted"
empty() { [[ -z $(ls -A "$WORK/cache/published" 2>/dev/null) ]]; }
wait_for "published/ empty" 60 empty
! grep -q "$KUBELET_PODS/.*kubernetes.io~csi" /proc/self/mountinfo || die "a csi mount is left: $(grep "$KUBELET_PODS" /proc/self/mountinfo)"
# The publish latency the plugin logged for a publish that hashed the artifact (building the
# volume, hashing, mounting: the first after the plugin started), against sha256sum of the same
# cached file in the same run (the hash's bound).
latency=$(csi_logs | jq -rR 'fromjson? | select(.fields.message == "published read-only" and .fields.hashed == true) | .fields.seconds' | tail -1 || true)
t0=$(date +%s.%N)
sha256sum "$WORK/cache/artifacts/$DIGEST/artifact" >/dev/null
bound=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.6f", b - a}')
echo "   published/ empty, no csi mount left"
echo "publish (volume built, $SIZE-byte artifact hashed, bind-mounted): ${latency:-?} s; sha256sum of it: $bound s; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "csi passed"
