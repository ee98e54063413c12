# shellcheck shell=bash
# Helpers for e2e tests. Each test is an executable script run by e2e/test.sh
# through `e2e/cluster run`, so KUBECONFIG and PATH (kubectl, helm) are set.
# A test exits 0 to pass, 77 to skip, anything else to fail.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$E2E_DIR/lib/common.sh"

BUSYBOX_IMAGE=kiln-e2e/busybox:test
# Its OCI tarball (index.json names the manifest digest).
BUSYBOX_TAR=${TMPDIR:-/tmp}/kiln-e2e-busybox.tar

fail() { echo "FAIL: $*" >&2; exit 1; }
# skip REASON: exit 77, which e2e/test.sh counts and names as skipped. Under CI (`CI=true`)
# nothing may skip but what no CI machine can run: a missing prerequisite there is a failure,
# because the suite installs every prerequisite itself (scripts/test.sh).
skip() {
  [[ ${CI:-} != true ]] || fail "required under CI=true, but: $*"
  echo "SKIP: $*" >&2
  exit 77
}
# skip_no_gpu REASON: the one skip allowed under CI, for work that needs a GPU.
skip_no_gpu() { echo "SKIP: no GPU: $*" >&2; exit 77; }

# ensure_busybox: Debian's static busybox, packaged by build-image and loaded
# into the node (idempotent: import of the same digest is a no-op).
ensure_busybox() {
  [[ -f $BUSYBOX_TAR ]] || "$E2E_DIR/build-image" --name "$BUSYBOX_IMAGE" --out "$BUSYBOX_TAR" --link-applets "$(command -v busybox)" 2>/dev/null
  "$E2E_DIR/cluster" load-image "$BUSYBOX_TAR" >/dev/null 2>&1
}

# test_namespace: a fresh namespace, deleted when the test exits.
test_namespace() {
  TEST_NS=e2e-$(basename "$0" .sh | tr -c 'a-z0-9\n' '-')-$RANDOM
  kubectl create namespace "$TEST_NS" >/dev/null
  trap 'kubectl delete namespace "$TEST_NS" --wait=false >/dev/null 2>&1 || true' EXIT
  # The namespace's default serviceaccount comes from the controller manager.
  local end=$((SECONDS + 30))
  while ((SECONDS < end)); do
    kubectl -n "$TEST_NS" get serviceaccount default >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  fail "no default serviceaccount in $TEST_NS"
}

# dump NS: what a failing test leaves for the reader.
dump() {
  kubectl -n "$1" get all -o wide 2>&1 || true
  kubectl -n "$1" get events --sort-by=.lastTimestamp 2>&1 | tail -20 || true
}

# wait_for DESC SECONDS CMD...: polls CMD every 0.2 s until it succeeds or SECONDS of wall time
# have passed (however long each poll takes under load); then calls the test's `die` (which shows
# its own logs). CMD is tried once more at the deadline, so a slow last poll still counts.
wait_for() {
  local desc=$1 secs=$2 end; shift 2
  end=$((SECONDS + secs))
  while ((SECONDS < end)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  "$@" >/dev/null 2>&1 && return 0
  die "timed out after ${secs}s: $desc"
}

# bin NAME: $KILN_E2E_OPERATOR_BIN / $KILN_E2E_AGENT_BIN for kiln-operator / kiln-agent when set
# (faults.sh's agent with the test-only hook), else NAME from $KILN_E2E_BIN_DIR: the product
# binaries e2e/test.sh builds once per run with scripts/test/product-bins.sh, never whatever a test
# build left in target/. A test run alone builds them (a no-op build after the first, then a copy)
# into $KILN_E2E_ARTIFACTS/bin, as the runner does.
bin() {
  local override=
  case $1 in
    kiln-operator) override=${KILN_E2E_OPERATOR_BIN:-} ;;
    kiln-agent) override=${KILN_E2E_AGENT_BIN:-} ;;
    kiln-csi) override=${KILN_E2E_CSI_BIN:-} ;;
  esac
  [[ -z $override ]] || { echo "$override"; return; }
  local dir=${KILN_E2E_BIN_DIR:-}
  if [[ -z $dir ]]; then
    dir=${KILN_E2E_ARTIFACTS:-/tmp/kiln-e2e-test}/bin
    "$REPO/scripts/test/product-bins.sh" "$dir" >/dev/null || fail "cannot build the product binaries"
  fi
  [[ -x $dir/$1 ]] || fail "$1 is not in KILN_E2E_BIN_DIR ($dir)"
  echo "$dir/$1"
}

# kiln_image NAME IMAGE DIR [BUILD-IMAGE ARGS...]: the stripped binary NAME (see bin) at
# /bin/NAME, with CA certificates (the HTTPS clients load the system roots even for file://
# work), built by build-image in DIR and loaded into the node as IMAGE.
kiln_image() {
  local name=$1 image=$2 dir=$3
  shift 3
  strip -o "$dir/$name" "$(bin "$name")"
  # Only faults.sh builds an image of the agent with the test-only hook, and says so.
  [[ ${KILN_E2E_FAULT_AGENT:-} == 1 && $name == kiln-agent ]] ||
    "$REPO/scripts/test/product-bins.sh" --check "$dir/$name" || fail "the $image image would carry the fault-injection hook"
  "$E2E_DIR/build-image" --name "$image" --out "$dir/$name.tar" \
    --add /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt "$@" "$dir/$name" >/dev/null
  "$E2E_DIR/cluster" load-image "$dir/$name.tar" >/dev/null
}

# sa_kubeconfig NAMESPACE SERVICEACCOUNT DIR: writes DIR/kubeconfig (and DIR/ca.crt) holding a
# 2-hour token of that ServiceAccount, so a component run as a host process gets only what its
# RBAC grants.
sa_kubeconfig() {
  local ns=$1 sa=$2 dir=$3 token server
  token=$(kubectl -n "$ns" create token "$sa" --duration=2h)
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$dir/ca.crt"
  cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: "$dir/ca.crt"}}]
users: [{name: $sa, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: $sa}}]
current-context: c
KC
}
