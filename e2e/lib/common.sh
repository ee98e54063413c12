# shellcheck shell=bash
# Shared settings for e2e/cluster, e2e/test.sh and the tests. Sourced, not run.
# shellcheck disable=SC2034 # settings are used by the scripts that source this

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

K8S_VERSION=v1.34.10
ETCD_VERSION=v3.6.4 # the etcd server that k8s.io/kubernetes v1.34 itself requires
HELM_VERSION=v3.19.5
PAUSE_IMAGE=registry.k8s.io/pause:3.10

CACHE=${KILN_E2E_CACHE:-/var/cache/kiln-e2e}
STATE=${KILN_E2E_STATE:-/var/lib/kiln-e2e}
NETNS=${KILN_E2E_NETNS:-kiln-e2e}
NODE_NAME=${KILN_E2E_NODE:-kiln-e2e}

# Private /30 between the host and the cluster's network namespace. The node,
# etcd and the apiserver live at NODE_IP inside the namespace; the host reaches
# the apiserver over the veth and nothing else is routed out.
HOST_IP=${KILN_E2E_HOST_IP:-10.201.0.1}
NODE_IP=${KILN_E2E_NODE_IP:-10.201.0.2}
POD_CIDR=10.244.0.0/24
# Every node's pod range: node i (1..N) gets 10.244.(i-1).0/24.
CLUSTER_CIDR=10.244.0.0/16
# Extra nodes (e2e/cluster up --nodes N): node i (2..N) is $NODE_NAME-i at $NODES_NET.i in its
# own network namespace $NETNS-i, on a bridge in the first node's namespace ($NODES_NET.1).
NODES_NET=10.202.0
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1

KUBECONFIG_PATH=$STATE/admin.kubeconfig

# The cluster's OCI registry (full mode): plain HTTP on the node address, reachable from pods and
# from the host side of the veth; `oci://$REGISTRY_ADDR/<repo>` is a kiln store URL.
REGISTRY_ADDR=$NODE_IP:5000
REGISTRY_DIR=$STATE/registry

log() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# cache_key DIR: short hash of a build module's go.mod and go.sum, so that a
# changed pin lands in a fresh cache directory instead of reusing stale binaries.
cache_key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }

K8S_BIN=$CACHE/k8s-$K8S_VERSION-$(cache_key "$E2E_DIR/k8s-build")/bin
HELM_BIN=$CACHE/helm-$HELM_VERSION-$(cache_key "$E2E_DIR/helm-build")/bin
# kiln-health (e2e/health): kstatus and Argo CD's Lua health checks, as the GitOps tools run them.
HEALTH_BIN=$CACHE/health-$(cat "$E2E_DIR/health/"{go.mod,go.sum,main.go} | sha256sum | cut -c1-12)/bin
PAUSE_DIR=$CACHE/pause-3.10-$(cat "$E2E_DIR/pause/pause.c" "$E2E_DIR/build-image" "$E2E_DIR/lib/build.sh" | sha256sum | cut -c1-12)
