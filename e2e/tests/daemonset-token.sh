#!/usr/bin/env bash
# A DaemonSet pod reaches the apiserver through the kubernetes Service with its
# projected service-account token: it is authenticated as its serviceaccount
# (SelfSubjectReview) and authorised by RBAC (reads a configmap a Role grants).
source "$(dirname "$0")/lib.sh"
ensure_busybox
test_namespace

word=secret-$RANDOM$RANDOM
kubectl -n "$TEST_NS" create configmap probe --from-literal=word="$word" >/dev/null
kubectl -n "$TEST_NS" create serviceaccount prober >/dev/null
kubectl -n "$TEST_NS" create role read-probe --verb=get --resource=configmaps --resource-name=probe >/dev/null
kubectl -n "$TEST_NS" create rolebinding prober --role=read-probe --serviceaccount="$TEST_NS:prober" >/dev/null

kubectl -n "$TEST_NS" apply -f - <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: prober}
spec:
  selector: {matchLabels: {app: prober}}
  template:
    metadata: {labels: {app: prober}}
    spec:
      serviceAccountName: prober
      terminationGracePeriodSeconds: 1
      containers:
      - name: probe
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
        command:
        - sh
        - -c
        - |
          sa=/var/run/secrets/kubernetes.io/serviceaccount
          api=https://\$KUBERNETES_SERVICE_HOST:\$KUBERNETES_SERVICE_PORT
          auth="Authorization: Bearer \$(cat \$sa/token)"
          until wget -q -O- --no-check-certificate --header "\$auth" --header "Content-Type: application/json" \
              --post-data '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
              \$api/apis/authentication.k8s.io/v1/selfsubjectreviews; do sleep 1; done
          echo
          wget -q -O- --no-check-certificate --header "\$auth" \
              \$api/api/v1/namespaces/\$(cat \$sa/namespace)/configmaps/probe
          echo
          # Without the token the same read must be refused.
          wget -q -O- --no-check-certificate \$api/api/v1/namespaces/\$(cat \$sa/namespace)/configmaps/probe \
            && echo ANONYMOUS-ALLOWED || echo anonymous-refused
          exec sleep 3600
YAML
kubectl -n "$TEST_NS" rollout status ds/prober --timeout=90s || { dump "$TEST_NS"; fail "daemonset not ready"; }
end=$((SECONDS + 60))
while ((SECONDS < end)); do
  out=$(kubectl -n "$TEST_NS" logs ds/prober 2>/dev/null || true)
  [[ $out == *anonymous-* || $out == *ANONYMOUS-* ]] && break
  sleep 1
done
echo "$out" | head -c 2000; echo
grep -qE "\"username\": *\"system:serviceaccount:$TEST_NS:prober\"" <<<"$out" || fail "token not authenticated as the serviceaccount"
grep -qE "\"word\": *\"$word\"" <<<"$out" || fail "configmap not read with the token"
[[ $out == *anonymous-refused* ]] || fail "anonymous read was not refused"
