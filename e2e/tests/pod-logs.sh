#!/usr/bin/env bash
# A pod from a locally built image (imagePullPolicy: Never) runs, and its
# output comes back through kubectl logs (apiserver -> kubelet -> containerd).
source "$(dirname "$0")/lib.sh"
ensure_busybox
test_namespace

word=hello-$RANDOM$RANDOM
kubectl -n "$TEST_NS" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  restartPolicy: Never
  containers:
  - name: hello
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo "$word from \$(hostname)"']
YAML
kubectl -n "$TEST_NS" wait pod/hello --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s ||
  { dump "$TEST_NS"; fail "pod did not succeed"; }
out=$(kubectl -n "$TEST_NS" logs hello)
[[ $out == "$word from hello" ]] || fail "logs: got '$out', want '$word from hello'"
echo "logs: $out"
