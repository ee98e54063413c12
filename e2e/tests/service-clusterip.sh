#!/usr/bin/env bash
# A normal pod reaches the apiserver at the kubernetes Service's ClusterIP,
# i.e. through kube-proxy's iptables DNAT to the node address.
source "$(dirname "$0")/lib.sh"
ensure_busybox
test_namespace

ip=$(kubectl -n default get service kubernetes -o jsonpath='{.spec.clusterIP}')
port=$(kubectl -n default get service kubernetes -o jsonpath='{.spec.ports[0].port}')
[[ $ip == "$KUBERNETES_SVC_IP" ]] || fail "kubernetes service at $ip, want $KUBERNETES_SVC_IP"
kubectl -n "$TEST_NS" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: client
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [wget, -q, -O-, --no-check-certificate, 'https://$ip:$port/version']
YAML
kubectl -n "$TEST_NS" wait pod/client --for=jsonpath='{.status.phase}'=Succeeded --timeout=60s ||
  { dump "$TEST_NS"; kubectl -n "$TEST_NS" logs client || true; fail "client pod did not succeed"; }
out=$(kubectl -n "$TEST_NS" logs client)
got=$(jq -r .gitVersion <<<"$out") || fail "not JSON: $out"
[[ $got == "$K8S_VERSION" ]] || fail "version through ClusterIP: $got"
echo "https://$ip:$port/version from a pod: $got"
