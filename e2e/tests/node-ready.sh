#!/usr/bin/env bash
# The node registers, reaches Ready, and reports the version and address we run.
source "$(dirname "$0")/lib.sh"

kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=60s
node=$(kubectl get node "$NODE_NAME" -o json)
version=$(jq -r .status.nodeInfo.kubeletVersion <<<"$node")
[[ $version == "$K8S_VERSION" ]] || fail "kubelet version $version, want $K8S_VERSION"
ip=$(jq -r '.status.addresses[] | select(.type == "InternalIP") | .address' <<<"$node")
[[ $ip == "$NODE_IP" ]] || fail "node InternalIP $ip, want $NODE_IP"
runtime=$(jq -r .status.nodeInfo.containerRuntimeVersion <<<"$node")
[[ $runtime == containerd://* ]] || fail "runtime $runtime"
server=$(kubectl version -o json | jq -r .serverVersion.gitVersion)
[[ $server == "$K8S_VERSION" ]] || fail "apiserver version $server, want $K8S_VERSION"
echo "node $NODE_NAME Ready, kubelet $version, $runtime, $ip"
