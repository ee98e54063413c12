# shellcheck shell=bash
# Helpers for e2e tests. Each test is an executable script run by e2e/test.sh
# through `e2e/cluster run`, so KUBECONFIG and PATH (kubectl, helm) are set.
# A test exits 0 to pass, 77 to skip, anything else to fail.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$E2E_DIR/lib/common.sh"

BUSYBOX_IMAGE=kiln-e2e/busybox:test

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

# ensure_busybox: Debian's static busybox, packaged by build-image and loaded
# into the node (idempotent: import of the same digest is a no-op).
ensure_busybox() {
  local tar=${TMPDIR:-/tmp}/kiln-e2e-busybox.tar
  [[ -f $tar ]] || "$E2E_DIR/build-image" --name "$BUSYBOX_IMAGE" --out "$tar" --link-applets "$(command -v busybox)" 2>/dev/null
  "$E2E_DIR/cluster" load-image "$tar" >/dev/null 2>&1
}

# test_namespace: a fresh namespace, deleted when the test exits.
test_namespace() {
  TEST_NS=e2e-$(basename "$0" .sh | tr -c 'a-z0-9\n' '-')-$RANDOM
  kubectl create namespace "$TEST_NS" >/dev/null
  trap 'kubectl delete namespace "$TEST_NS" --wait=false >/dev/null 2>&1 || true' EXIT
  # The namespace's default serviceaccount comes from the controller manager.
  local i
  for ((i = 0; i < 60; i++)); do
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
