#!/usr/bin/env bash
# Runs kiln's cluster tests end to end and prints, as its last line,
# "N passed, N failed, N skipped". Exits nonzero when any test failed.
#
#   e2e/test.sh              full cycle: down of a cluster left running, up, cluster
#                            tests, down + leak check, up --control-plane-only, API
#                            test, down + leak check
#   e2e/test.sh --no-lifecycle [TEST...]
#                            only the cluster tests (or the named ones, e.g.
#                            pod-logs) against an already running cluster
#
# Test logs go to $KILN_E2E_ARTIFACTS (default /tmp/kiln-e2e-test); a failing
# test's output and the component logs it needs are printed inline.
set -uo pipefail

E2E=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
source "$E2E/lib/common.sh"
ARTIFACTS=${KILN_E2E_ARTIFACTS:-/tmp/kiln-e2e-test}
CLUSTER_TESTS=(up-idempotent network-isolation node-ready pod-logs dynamic-image job daemonset-token service-clusterip crd kiln-crds registry operator compile-exec operator-nodes agent store-oci helm chart-render chart kiln)

passed=0 failed=0 skipped=0
failures=()
mkdir -p "$ARTIFACTS"

# record NAME STATUS SECONDS
record() {
  local name=$1 rc=$2 secs=$3
  case $rc in
    0) passed=$((passed + 1)); printf 'PASS %-28s %4ss\n' "$name" "$secs" ;;
    77) skipped=$((skipped + 1)); printf 'SKIP %-28s %4ss\n' "$name" "$secs" ;;
    *) failed=$((failed + 1)); failures+=("$name")
       # The test's own verdict first: the tail below may be cut short where it is shown.
       printf 'FAIL %-28s %4ss (exit %s) %s\n' "$name" "$secs" "$rc" \
         "$(grep -m1 '^FAIL: ' "$ARTIFACTS/$name.log" | cut -c7-200)"
       sed 's/^/    | /' "$ARTIFACTS/$name.log" | tail -n 60 ;;
  esac
}

# step NAME CMD...: run CMD as one counted test, output to its log.
step() {
  local name=$1; shift
  local start=$SECONDS rc=0
  "$@" >"$ARTIFACTS/$name.log" 2>&1 || rc=$?
  record "$name" "$rc" $((SECONDS - start))
  return "$rc"
}

cluster_tests() {
  local t
  for t in "$@"; do
    step "$t" "$E2E/cluster" run -- "$E2E/tests/$t.sh"
  done
}

finish() {
  ((failed)) && echo "failed: ${failures[*]} (logs in $ARTIFACTS)"
  if ((skipped)); then
    echo "$passed passed, $failed failed, $skipped skipped"
  else
    echo "$passed passed, $failed failed"
  fi
  ((failed == 0))
  exit
}

if [[ ${1:-} == --no-lifecycle ]]; then
  shift
  if (($#)); then cluster_tests "$@"; else cluster_tests "${CLUSTER_TESTS[@]}"; fi
  finish
fi

t0=$SECONDS
# The full cycle owns the cluster. One left running (a benchmark, an earlier run, a session that
# stopped with it up) would be adopted by `up` and carry its objects and load into every test
# (one CI run met 1,000 benchmark targets and their Jobs: the Job controller never got to ours),
# so it goes first.
if [[ -d $STATE ]]; then
  echo "a cluster ($(cat "$STATE/mode" 2>/dev/null || echo 'unknown mode')) was left running: taking it down first"
  "$E2E/cluster" down >"$ARTIFACTS/down-leftover.log" 2>&1 ||
    { sed 's/^/    | /' "$ARTIFACTS/down-leftover.log"; echo "cannot take the leftover cluster down"; exit 1; }
fi
if step up "$E2E/cluster" up; then
  grep -E 'cluster up|built in' "$ARTIFACTS/up.log" | sed 's/^/    /'
  cluster_tests "${CLUSTER_TESTS[@]}"
else
  for t in "${CLUSTER_TESTS[@]}"; do record "$t" 1 0 >/dev/null; done
  echo "     (cluster tests not run: up failed)"
  mkdir -p "$ARTIFACTS/components"
  cp "$STATE"/logs/*.log "$ARTIFACTS/components/" 2>/dev/null
fi
step down "$E2E/cluster" down
step down-clean "$E2E/tests/down-clean.sh"

if step up-control-plane-only "$E2E/cluster" up --control-plane-only; then
  grep -E 'cluster up' "$ARTIFACTS/up-control-plane-only.log" | sed 's/^/    /'
  step control-plane-api "$E2E/cluster" run -- "$E2E/tests/control-plane-api.sh"
fi
step down-control-plane-only "$E2E/cluster" down
step down-clean-control-plane-only "$E2E/tests/down-clean.sh"
echo "total wall time: $((SECONDS - t0))s"
finish
