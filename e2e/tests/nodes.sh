#!/usr/bin/env bash
# Every node of a multi-node cluster (e2e/cluster up --nodes N) is a real kubelet: each Ready
# with its own InternalIP and pod range; a pod pinned to each node serves HTTP, and every pod
# reaches the pods of the other nodes, the registry and the apiserver through the kubernetes
# Service; `kubectl logs` reaches each node's kubelet. Skipped on one node. (Debian's static
# busybox wget crashes with -T, so `timeout` bounds each request.)
source "$(dirname "$0")/lib.sh"
mapfile -t NODES < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
((${#NODES[@]} >= 2)) || skip "one node; run e2e/cluster up --nodes 2"
ensure_busybox
test_namespace

declare -A IPS
for n in "${NODES[@]}"; do
  kubectl wait --for=condition=Ready "node/$n" --timeout=60s >/dev/null || fail "node $n not Ready"
  IPS[$n]=$(kubectl get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
done
(($(printf '%s\n' "${IPS[@]}" | sort -u | wc -l) == ${#NODES[@]})) || fail "nodes share an InternalIP: ${IPS[*]}"

# One web server per node, each pinned by nodeName, serving its node's name.
for n in "${NODES[@]}"; do
  kubectl -n "$TEST_NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web-$n}
spec:
  nodeName: $n
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && echo $n > /www/index.html && exec httpd -f -p 8080 -h /www']
YAML
done
for n in "${NODES[@]}"; do
  kubectl -n "$TEST_NS" wait "pod/web-$n" --for=condition=Ready --timeout=60s >/dev/null ||
    { dump "$TEST_NS"; fail "web pod on $n not Ready"; }
done
declare -A POD_IPS
for n in "${NODES[@]}"; do POD_IPS[$n]=$(kubectl -n "$TEST_NS" get pod "web-$n" -o jsonpath='{.status.podIP}'); done
(($(printf '%s\n' "${POD_IPS[@]}" | cut -d. -f1-3 | sort -u | wc -l) == ${#NODES[@]})) ||
  fail "pods of different nodes share a range: ${POD_IPS[*]}"

svc=$(kubectl -n default get service kubernetes -o jsonpath='{.spec.clusterIP}')
for from in "${NODES[@]}"; do
  for to in "${NODES[@]}"; do
    [[ $from == "$to" ]] && continue
    got=$(kubectl -n "$TEST_NS" exec "web-$from" -- timeout 10 wget -q -O- "http://${POD_IPS[$to]}:8080/") ||
      fail "pod on $from cannot reach the pod on $to (${POD_IPS[$to]})"
    [[ $got == "$to" ]] || fail "pod on $from reached ${POD_IPS[$to]} and got ${got@Q}, want $to"
  done
  kubectl -n "$TEST_NS" exec "web-$from" -- timeout 10 wget -q -O /dev/null "http://$REGISTRY_ADDR/v2/" ||
    fail "pod on $from cannot reach the registry at $REGISTRY_ADDR"
  kubectl -n "$TEST_NS" exec "web-$from" -- timeout 10 wget -q -O /dev/null --no-check-certificate "https://$svc/livez" ||
    fail "pod on $from cannot reach the apiserver at the kubernetes Service $svc"
  kubectl -n "$TEST_NS" logs "web-$from" >/dev/null || fail "kubectl logs cannot reach the kubelet of $from"
done
for n in "${NODES[@]}"; do echo "   $n: node ${IPS[$n]}, pod ${POD_IPS[$n]}"; done
echo "${#NODES[@]} nodes: every pod reaches the other nodes' pods, the registry and the apiserver"
