# shellcheck shell=bash
# Helpers for the CRD tests. Sourced after lib.sh and test_namespace.
# shellcheck disable=SC2034 # settings are used by the scripts that source this
REPO=$(cd "$E2E_DIR/.." && pwd)
HEX=$(printf 'kiln' | sha256sum | cut -c1-64)

establish() {
  local f=$1 names
  kubectl apply --server-side --force-conflicts -f "$f" >/dev/null
  names=$(kubectl create --dry-run=client -o name -f "$f")
  kubectl wait --for=condition=Established $names --timeout=30s >/dev/null || fail "$f not Established"
  echo "established: $(tr '\n' ' ' <<<"$names")"
}

# expect_reject WHY PATTERN: stdin must be refused with an error matching PATTERN.
expect_reject() {
  local out
  if out=$(kubectl -n "$TEST_NS" "$@" 2>&1); then fail "accepted, but should be rejected: $WHY"; fi
  grep -qiE "$PATTERN" <<<"$out" || fail "rejected for the wrong reason ($WHY): $out"
  echo "rejected as expected ($WHY)"
}

widget() { # NAME SHA REPLICAS MAX
  printf 'apiVersion: e2e.kiln.dev/v1alpha1\nkind: Widget\nmetadata: {name: %s}\nspec: {sha256: "%s", replicas: %s, maxReplicas: %s}\n' "$@"
}

