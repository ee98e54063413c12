#!/usr/bin/env bash
# charts/kiln installs kiln on the real cluster: images built by build-image from this checkout,
# the store on a hostPath. Helm creates the CRDs (Established, keep policy); the operator
# Deployment becomes Available under its chart RBAC, leads through its Lease, and reconciles the
# example model into a compile Job that stores the artifact; its /metrics, through the metrics
# Service, passes promtool; the agent DaemonSet's pod becomes Ready on the node with its
# ServiceAccount, NODE_NAME and hostPath cache, reports its KilnNode, and its /metrics passes
# promtool; `helm uninstall` removes the release and keeps the CRDs.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
test_namespace
NS=$TEST_NS
REL=$NS
WORK=$(mktemp -d /var/tmp/kiln-e2e-chart.XXXXXX)
chmod 755 "$WORK"
cleanup() {
  helm uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
die() {
  kubectl -n "$NS" get all,compiledtargets -o wide >&2 || true
  kubectl -n "$NS" logs deploy/kiln-operator --tail=30 >&2 || true
  dump "$NS" >&2
  fail "$*"
}

kiln_images "$WORK"
# Store written by the compile Jobs (uid 65532); sources read-only.
install -d -m 755 -o 65532 -g 65532 "$WORK/store"
kiln_example_dirs "$WORK"

echo "== helm install (CRDs, operator, agent, RBAC, metrics Services)"
kiln_fresh_crds
t0=$SECONDS
kiln_install "$REL" "$NS" --set store.url="$WORK/store" --set sources.hostPath="$WORK/sources" \
  --set agent.cacheHostPath="$WORK/cache" >/dev/null || die "helm install failed"
for crd in modelartifacts compiledtargets kilnnodes; do
  kubectl wait --for=condition=Established "crd/$crd.kiln.dev" --timeout=60s >/dev/null || die "$crd not Established"
  [[ $(kubectl get crd "$crd.kiln.dev" -o jsonpath='{.metadata.annotations.helm\.sh/resource-policy}') == keep ]] ||
    die "$crd lacks the keep policy"
done
kubectl -n "$NS" wait --for=condition=Available deploy/kiln-operator --timeout=120s >/dev/null ||
  die "operator Deployment not Available"
echo "   operator Available $((SECONDS - t0))s after install"
POD=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
wait_for "operator leads through its Lease" 60 \
  bash -c "[[ \$(kubectl -n $NS get lease kiln-operator -o jsonpath='{.spec.holderIdentity}') == $POD ]]"
[[ $(kubectl -n "$NS" get pod "$POD" -o jsonpath='{.spec.serviceAccountName}') == kiln-operator ]] || die "operator SA"

echo "== the in-cluster operator reconciles the example under the chart's RBAC"
kubectl -n "$NS" apply -f "$REPO/examples/squeezenet/kiln.yaml" >/dev/null
REAL=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
wait_for "class label on $REAL" 60 kubectl get node "$REAL" -o jsonpath='{.metadata.labels.kiln\.dev/class}'
digest() { kubectl -n "$NS" get compiledtarget squeezenet-cpu -o json | jq -er '.status.classes[0].artifactDigest // empty'; }
wait_for "the compile Job stores the artifact" 240 digest
KEY=$(kubectl -n "$NS" get compiledtarget squeezenet-cpu -o jsonpath='{.status.classes[0].compileKey}')
[[ $(sha256sum "$WORK/store/artifacts/$KEY/artifact" | cut -d' ' -f1) == "$(digest)" ]] ||
  die "status digest differs from the stored artifact"
echo "   compiled: sha256:$(digest)"

echo "== metrics through the operator's metrics Service pass promtool"
m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-operator-metrics:metrics/proxy/metrics") ||
  die "no /metrics through the Service"
grep -q '^kiln_operator_compile_jobs_total{.*result="succeeded"' <<<"$m" || die "no succeeded compile in /metrics"
promtool check metrics <<<"$m" || die "promtool rejects the operator's in-cluster exposition"

echo "== agent DaemonSet: Ready on the node, its KilnNode reported, metrics pass promtool"
kubectl -n "$NS" rollout status ds/kiln-agent --timeout=120s >/dev/null || die "agent DaemonSet not ready"
AGENT=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$NS" get pod "$AGENT" -o json | jq -e --arg n "$REAL" '
  .spec.nodeName == $n and .spec.serviceAccountName == "kiln-agent" and .spec.containers[0].args == ["run"] and
  (.spec.containers[0].env[] | select(.name == "NODE_NAME") | .valueFrom.fieldRef.fieldPath == "spec.nodeName") and
  (.spec.volumes[] | select(.name == "cache") | .hostPath.path != null)' >/dev/null || die "agent pod spec"
wait_for "KilnNode $REAL with hardware facts" 60 \
  bash -c "kubectl get kilnnode $REAL -o json | jq -e '.status.hardware.cores > 0'"
m=$(kubectl get --raw "/api/v1/namespaces/$NS/services/kiln-agent-metrics:metrics/proxy/metrics") ||
  die "no agent /metrics through the Service"
promtool check metrics <<<"$m" || die "promtool rejects the agent's in-cluster exposition"
echo "   $AGENT Ready on $REAL; KilnNode $REAL: $(kubectl get kilnnode "$REAL" -o json | jq -c '.status.hardware | {arch, cpuLevel, cores}')"

echo "== helm uninstall keeps the CRDs"
kubectl -n "$NS" delete compiledtarget squeezenet-cpu --wait=true --timeout=60s >/dev/null
helm uninstall "$REL" -n "$NS" >/dev/null || die "helm uninstall failed"
for crd in modelartifacts compiledtargets kilnnodes; do
  kubectl get crd "$crd.kiln.dev" >/dev/null 2>&1 || fail "uninstall deleted crd/$crd.kiln.dev"
done
kubectl get clusterrole "$REL-kiln-operator" >/dev/null 2>&1 && fail "uninstall left the operator ClusterRole"
kubectl -n "$NS" get deploy kiln-operator >/dev/null 2>&1 && fail "uninstall left the operator Deployment"
kubectl -n "$NS" get modelartifact squeezenet >/dev/null 2>&1 || fail "uninstall lost the ModelArtifact"
echo "chart passed"
