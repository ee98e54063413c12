#!/usr/bin/env bash
# A second `up` on a running cluster restarts nothing, rebuilds nothing, and
# prints the same KUBECONFIG line.
source "$(dirname "$0")/lib.sh"

before=$(cat "$STATE"/pids/*.pid | sort)
start=$SECONDS
out=$("$E2E_DIR/cluster" up 2>&1)
took=$((SECONDS - start))
after=$(cat "$STATE"/pids/*.pid | sort)
[[ $before == "$after" ]] || fail "component PIDs changed: $before -> $after"
grep -q 'building' <<<"$out" && fail "second up rebuilt: $out"
[[ $(tail -n1 <<<"$out") == "KUBECONFIG=$KUBECONFIG_PATH" ]] || fail "last line: $(tail -n1 <<<"$out")"
((took < 30)) || fail "second up took ${took}s"
echo "second up: ${took}s, same $(wc -l <<<"$after") PIDs"
