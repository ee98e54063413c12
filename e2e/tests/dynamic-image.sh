#!/usr/bin/env bash
# build-image packages a dynamically linked binary (jq: libjq, libonig, libc)
# with the shared libraries ldd finds, and it runs in a pod — the path kiln's
# own Rust binaries take.
source "$(dirname "$0")/lib.sh"
test_namespace

jq=$(command -v jq)
ldd "$jq" | grep -q 'libc.so' || skip "$jq is not dynamically linked"
tar=$(mktemp --suffix=.tar)
trap 'rm -f "$tar"; kubectl delete namespace "$TEST_NS" --wait=false >/dev/null 2>&1 || true' EXIT
"$E2E_DIR/build-image" --name kiln-e2e/jq:test --out "$tar" "$jq"
tar -tf "$tar" >/dev/null
"$E2E_DIR/cluster" load-image "$tar"
kubectl -n "$TEST_NS" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: jq}
spec:
  restartPolicy: Never
  containers:
  - name: jq
    image: kiln-e2e/jq:test
    imagePullPolicy: Never
    args: [-cn, '{sum: (40 + 2), from: "jq"}']
YAML
kubectl -n "$TEST_NS" wait pod/jq --for=jsonpath='{.status.phase}'=Succeeded --timeout=60s ||
  { dump "$TEST_NS"; kubectl -n "$TEST_NS" logs jq || true; fail "jq pod did not succeed"; }
out=$(kubectl -n "$TEST_NS" logs jq)
[[ $out == '{"sum":42,"from":"jq"}' ]] || fail "output: $out"
echo "dynamically linked jq ran in a pod: $out"
