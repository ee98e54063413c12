# shellcheck shell=bash
# Shared set-up of the operator tests (operator.sh, operator-nodes.sh): the operator runs as a
# process on the host with the token of its ServiceAccount (the chart's RBAC,
# charts/kiln/templates/operator-rbac.yaml rendered for a release kiln in kiln-system, so missing
# RBAC fails the test); compile Jobs run the real `kiln-agent compile` from an image built by
# build-image; the model reaches the Job through a read-only hostPath (--sources-host-path) that
# relative file:// URIs resolve against; the store is a hostPath shared by the Jobs and the operator.
# No agent runs here, so a node is classified by its labels alone only when it carries every
# class key; `report_hardware` writes a node's KilnNode hardware the way its agent would.
# Sourced after lib.sh and observe-lib.sh; sets REPO, NS, WORK, OPERATOR, REAL (the real node;
# `bin`: KILN_E2E_OPERATOR_BIN and KILN_E2E_AGENT_BIN override the binaries) and the helpers below.
REPO=$(cd "$E2E_DIR/.." && pwd)
test_namespace
NS=$TEST_NS
WORK=$(mktemp -d /var/tmp/kiln-e2e-operator.XXXXXX)
chmod 755 "$WORK"
REAL=$(kubectl get nodes -l '!nvidia.com/gpu.product,!kiln-e2e/fake' -o jsonpath='{.items[0].metadata.name}')
OP_PIDS=()
CLEANUP_NODES=()
REPORTED=()
cleanup() {
  local p
  for p in "${OP_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if ((${#CLEANUP_NODES[@]})); then
    kubectl delete node "${CLEANUP_NODES[@]}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    kubectl delete kilnnode "${CLEANUP_NODES[@]}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  if ((${#REPORTED[@]})); then
    kubectl delete kilnnode "${REPORTED[@]}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  kubectl -n kiln-system delete lease "kiln-operator-$NS" --ignore-not-found >/dev/null 2>&1 || true
  # Cluster-scoped, so a later `helm install kiln` (the README's, in the kiln test) could not own them.
  kubectl delete clusterrolebinding/kiln-operator clusterrole/kiln-operator --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

OPERATOR=$(bin kiln-operator)

# report_hardware NODE: NODE's KilnNode with the hardware `kiln-agent probe` finds on this host
# (the real node), written as the agent writes it (server-side apply of the status subresource,
# field manager kiln-agent).
report_hardware() {
  kubectl apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: KilnNode
metadata: {name: $1}
spec: {}
YAML
  "$(bin kiln-agent)" probe | jq --arg n "$1" \
    '{apiVersion: "kiln.dev/v1alpha1", kind: "KilnNode", metadata: {name: $n}, status: {hardware}}' |
    kubectl apply --server-side --field-manager=kiln-agent --subresource=status -f - >/dev/null
  REPORTED+=("$1")
}

# The agent image: the stripped binary at /bin/kiln-agent.
kiln_image kiln-agent kiln-e2e/agent:test "$WORK"

# Store (written by the compile Jobs as uid 65532) and sources (read-only in the Jobs).
install -d -m 755 -o 65532 -g 65532 "$WORK/store"
install -d -m 755 "$WORK/sources"
cp "$REPO/examples/squeezenet/model.onnx" "$REPO/examples/squeezenet/fixture-v1.safetensors" "$WORK/sources/"
chmod 644 "$WORK/sources/"*

kubectl apply -f "$REPO/charts/kiln/files/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace kiln-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
helm template kiln "$REPO/charts/kiln" -n kiln-system --set store.url=/unused \
  --show-only templates/operator-rbac.yaml | kubectl apply -f - >/dev/null
# A kubeconfig with the operator's ServiceAccount token: the operator gets only what RBAC grants.
sa_kubeconfig kiln-system kiln-operator "$WORK"

# start_operator N [FLAGS...]: replica N, metrics on 127.0.0.1:1808N, log in
# $WORK/operator-N.log; LIMIT overrides --max-concurrent-compiles (20: the fake nodes' Jobs
# never finish).
start_operator() {
  local n=$1; shift
  KUBECONFIG=$WORK/kubeconfig "$OPERATOR" "$@" \
    --store "$WORK/store" --agent-image kiln-e2e/agent:test --agent-image-pull-policy Never \
    --sources-host-path "$WORK/sources" --listen "127.0.0.1:1808$n" --retry-backoff-seconds 2 \
    --max-concurrent-compiles "${LIMIT:-20}" \
    --lease-name "kiln-operator-$NS" --lease-namespace kiln-system --identity "replica-$n" \
    >>"$WORK/operator-$n.log" 2>&1 &
  OP_PIDS+=($!)
  eval "OP_$n=$!"
}
show_logs() {
  tail -n 20 "$WORK"/operator-*.log >&2 || true
  kubectl -n "$NS" get compiledtargets -o json 2>/dev/null |
    jq -r '.items[] | .metadata.name as $n | (.status.conditions[]? | "\($n) \(.type)=\(.status) \(.reason): \(.message)"), (.status.classes[]? | "\($n) class \(.class) \(.phase) \(.reason // "") \(.message // "")")' >&2 || true
  dump "$NS" >&2
}
# fd 3 is the test's stderr even inside wait_for's redirections.
exec 3>&2
die() { show_logs 2>&3; echo "FAIL: $*" >&3; exit 1; }

jobs_of() { kubectl -n "$NS" get jobs -l app.kubernetes.io/managed-by=kiln-operator -o json | jq -r --arg t "$1" '[.items[] | select(.metadata.ownerReferences[0].name == $t)] | length'; }
count_is() { [[ $(jobs_of "$1") == "$2" ]]; }
cond() { kubectl -n "$NS" get compiledtarget "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].$3}"; }
cond_is() { [[ $(cond "$1" "$2" status) == "$3" && $(cond "$1" "$2" reason) == "$4" ]]; }
# writes VAR N: VAR set to the API writes replica N has sent (a counter bumped by every write in
# operator/src/writes.rs); fails, rather than reading 0, when the replica does not answer.
writes() { metric_sum "$1" kiln_operator_api_writes_total curl -fsS "http://127.0.0.1:1808$2/metrics"; }
# no_writes_for SECS WHAT N...: replicas N... send no API write over SECS seconds: their counters,
# read at both ends, cover the whole window (a replica that died in it fails the second read).
# The replicas must have counted writes before (the leader has): a counter that reads 0
# everywhere could be one that counts nothing, and would show no write either way.
no_writes_for() {
  local secs=$1 what=$2 n w before=() after=() total=0
  shift 2
  for n in "$@"; do writes w "$n"; before+=("$w"); total=$((total + w)); done
  ((total > 0)) || die "no API write counted by replicas $* before the window: the counter cannot show an absence"
  sleep "$secs"
  for n in "$@"; do writes w "$n"; after+=("$w"); done
  [[ ${before[*]} == "${after[*]}" ]] || die "writes $what (replicas $*): ${before[*]} -> ${after[*]}"
}

# fake_nodes NAME...: Nodes of the real node's architecture in pool $NS (label kiln-e2e/pool),
# tainted so that nothing is scheduled there; no kubelet runs them.
fake_nodes() {
  local n
  for n in "$@"; do
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {kubernetes.io/arch: amd64, kubernetes.io/os: linux, kiln-e2e/fake: "true", kiln-e2e/pool: $NS}
spec:
  taints: [{key: kiln-e2e/fake, value: "true", effect: NoSchedule}]
YAML
  done | kubectl apply -f - >/dev/null
}

# target NAME SELECTOR [EXTRA]: a CompiledTarget of SqueezeNet batch 1 on tract, one class per
# architecture, on the nodes SELECTOR (`key: value`) matches.
target() {
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {fixtureVersion: v1}
  classLabelKeys: [kubernetes.io/arch]
  nodeSelector: {matchLabels: {$2}}
  ${3:-}
YAML
}
