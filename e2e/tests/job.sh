#!/usr/bin/env bash
# A batch/v1 Job with two completions runs to Complete.
source "$(dirname "$0")/lib.sh"
ensure_busybox
test_namespace

kubectl -n "$TEST_NS" apply -f - <<YAML
apiVersion: batch/v1
kind: Job
metadata: {name: twice}
spec:
  completions: 2
  parallelism: 2
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: work
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
        command: [sh, -c, 'echo job-done']
YAML
kubectl -n "$TEST_NS" wait job/twice --for=condition=Complete --timeout=120s ||
  { dump "$TEST_NS"; fail "job did not complete"; }
succeeded=$(kubectl -n "$TEST_NS" get job twice -o jsonpath='{.status.succeeded}')
[[ $succeeded == 2 ]] || fail "succeeded=$succeeded, want 2"
kubectl -n "$TEST_NS" logs job/twice | grep -cx job-done >/dev/null || fail "job logs lack job-done"
echo "job complete, $succeeded pods succeeded"
