# shellcheck shell=bash
# Helpers for the tests that install kiln with its Helm chart (chart.sh, kiln.sh): the images
# built from this checkout's binaries and the install itself. Source after lib.sh.
REPO=$(cd "$E2E_DIR/.." && pwd)
# Tag of the images built here; the chart runs them with imagePullPolicy Never.
KILN_TAG=e2e

# kiln_images DIR: kiln/operator:e2e and kiln/agent:e2e (kiln_image).
kiln_images() {
  local name
  for name in operator agent; do kiln_image "kiln-$name" "kiln/$name:$KILN_TAG" "$1"; done
}

# kiln_fresh_crds: delete kiln's CRDs if present, so that the install under test creates them
# (Helm refuses to take over objects another release or `kubectl apply` created). Run only
# while holding the e2e lock: it deletes every kiln object in the cluster.
kiln_fresh_crds() {
  local crds
  mapfile -t crds < <(kubectl get crd -o name | grep '\.kiln\.dev$' || true)
  ((${#crds[@]} == 0)) || kubectl delete "${crds[@]}" --wait=true --timeout=120s >/dev/null
}

# kiln_install RELEASE NAMESPACE [HELM ARGS...]: the chart with the images built here.
kiln_install() {
  local rel=$1 ns=$2 keys; shift 2
  # The attestation key pair the chart expects (attestation.existingSecret, on by default).
  keys=$(mktemp -d)
  "$(bin kiln-agent)" keygen "$keys/k" >/dev/null || return 1
  kubectl -n "$ns" create secret generic kiln-signing --from-file="$keys/k" >/dev/null || return 1
  rm -rf "$keys"
  helm install "$rel" "$REPO/charts/kiln" -n "$ns" \
    --set operator.image.tag=$KILN_TAG --set operator.image.pullPolicy=Never \
    --set agent.image.tag=$KILN_TAG --set agent.image.pullPolicy=Never \
    --set compile.retryBackoffSeconds=2 "$@"
}

# serving_pod NAMESPACE TARGET NODE: pod "serve" on NODE, annotated for TARGET and gated on
# kiln.dev/warm, as a serving workload declares itself to kiln.
serving_pod() {
  kubectl -n "$1" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: serve
  annotations: {kiln.dev/target: $2}
spec:
  readinessGates: [{conditionType: kiln.dev/warm}]
  nodeName: $3
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - {name: serve, image: $BUSYBOX_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}
YAML
}
