#!/usr/bin/env bash
# The cluster's network namespace routes nothing but its own ranges: the
# default route is a blackhole, so no pod or component can send traffic off
# the machine. Checked on the routing table; nothing is sent.
source "$(dirname "$0")/lib.sh"
ns=(nsenter --net="/run/netns/$NETNS")

"${ns[@]}" ip route show default | grep -q '^blackhole default' || fail "default route: $("${ns[@]}" ip route show default)"
for dst in 192.0.2.1 8.8.8.8 10.255.255.53; do
  if "${ns[@]}" ip route get "$dst" >/dev/null 2>&1; then fail "$dst is routable from the cluster"; fi
done
"${ns[@]}" ip route get "$KUBERNETES_SVC_IP" | grep -q 'dev lo' || fail "service range not routed locally"
"${ns[@]}" ip route get "$HOST_IP" | grep -q 'dev kiln-n' || fail "host end of the veth not reachable"
# And the host reaches the apiserver over the veth without entering the namespace.
kubectl get --raw /readyz >/dev/null || fail "apiserver not reachable from the host"
echo "only $POD_CIDR, $SERVICE_CIDR and $HOST_IP are routable; default is blackhole"
