# shellcheck shell=bash
# Configuration and command lines of the cluster's components. Sourced by
# e2e/cluster; start order: network, etcd, apiserver, then the node.
# A running component's files are left alone: kube-proxy exits when its
# configuration file changes.

CTR_SOCK=$STATE/run/containerd/containerd.sock

# node_env I: the settings of node I, as N_* globals that the node's components read (start,
# start_containerd, start_kubelet, start_kube_proxy, ctr_). Node 1 is $NODE_NAME: $NODE_IP in
# $NETNS, state directly under $STATE, components in kiln-e2e/components. Node I >= 2 is
# $NODE_NAME-I: $NODES_NET.I in $NETNS-I, state under $STATE/nodes/NAME, its components named
# COMPONENT@NAME, in the cgroup kiln-e2e/NAME (its kubelet's cgroupRoot).
node_env() {
  N_INDEX=$1
  if (($1 == 1)); then
    N_NAME=$NODE_NAME N_IP=$NODE_IP N_NETNS=$NETNS N_DIR=$STATE N_SUFFIX= N_CGROUP=
  else
    N_NAME=$NODE_NAME-$1 N_IP=$NODES_NET.$1 N_NETNS=$NETNS-$1
    N_DIR=$STATE/nodes/$NODE_NAME-$1 N_SUFFIX=@$NODE_NAME-$1 N_CGROUP=$NODE_NAME-$1
  fi
  N_POD_CIDR=10.244.$(($1 - 1)).0/24
  N_SOCK=$N_DIR/run/containerd/containerd.sock
}
node_env 1

# node_count: how many nodes the cluster runs (e2e/cluster up --nodes N; 1 by default).
node_count() { cat "$STATE/nodes.count" 2>/dev/null || echo 1; }

# node_index NAME: the index of node NAME, or nothing.
node_index() {
  local i
  for ((i = 1; i <= $(node_count); i++)); do
    node_env "$i"
    [[ $N_NAME == "$1" ]] && { echo "$i"; node_env 1; return 0; }
  done
  node_env 1
  return 1
}

# setup_node_net: the network namespace of the current extra node (node_env): a veth to the
# bridge kiln-br in node 1's namespace (created here, $NODES_NET.1/24), $N_IP/24 on its end, a
# blackhole default route, the apiserver and registry address ($NODE_IP) via node 1, the service
# range on lo as on node 1. Pod routes: route_pods.
setup_node_net() {
  local main=(nsenter --net="/run/netns/$NETNS") ns=(nsenter --net="/run/netns/$N_NETNS") host=kn$N_INDEX
  [[ -e /run/netns/$N_NETNS ]] || { log "creating network namespace $N_NETNS ($N_IP)"; ip netns add "$N_NETNS"; }
  if ! "${main[@]}" ip link show kiln-br >/dev/null 2>&1; then
    "${main[@]}" ip link add kiln-br type bridge
    "${main[@]}" ip addr add "$NODES_NET.1/24" dev kiln-br
  fi
  "${main[@]}" ip link set kiln-br up
  if ! "${main[@]}" ip link show "$host" >/dev/null 2>&1; then
    "${main[@]}" ip link add "$host" type veth peer name eth0 netns "$N_NETNS"
  fi
  "${main[@]}" ip link set "$host" master kiln-br up
  "${ns[@]}" ip link set lo up
  "${ns[@]}" ip addr replace "$N_IP/24" dev eth0
  "${ns[@]}" ip link set eth0 up
  "${ns[@]}" ip route replace blackhole default
  "${ns[@]}" ip route replace "$NODE_IP/32" via "$NODES_NET.1"
  "${ns[@]}" ip route replace "$SERVICE_CIDR" dev lo src "$N_IP"
  "${ns[@]}" sysctl -qw net.ipv4.ip_forward=1
}

# route_pods: in every node's namespace, a route to every other node's pod range.
route_pods() {
  local n i j via
  n=$(node_count)
  for ((i = 1; i <= n; i++)); do
    for ((j = 1; j <= n; j++)); do
      ((i == j)) && continue
      if ((j == 1)); then via=$NODES_NET.1; else via=$NODES_NET.$j; fi
      node_env "$j"
      local cidr=$N_POD_CIDR
      node_env "$i"
      nsenter --net="/run/netns/$N_NETNS" ip route replace "$cidr" via "$via"
    done
  done
  node_env 1
}

# The cluster's network namespace: veth $HOST_IP <-> $NODE_IP, a blackhole
# default route, and a route for the service range so that kube-proxy's DNAT
# in OUTPUT gets a chance (pod routes come from the CNI bridge). Nothing in the
# namespace can reach any address but the host end of the veth.
setup_netns() {
  if [[ ! -e /run/netns/$NETNS ]]; then
    log "creating network namespace $NETNS ($NODE_IP, host side $HOST_IP)"
    ip netns add "$NETNS"
  fi
  local ns=(nsenter --net="/run/netns/$NETNS")
  if ! ip link show kiln-h >/dev/null 2>&1; then
    ip link add kiln-h type veth peer name kiln-n
    ip link set kiln-n netns "$NETNS"
    ip addr add "$HOST_IP/30" dev kiln-h
    ip link set kiln-h up
  fi
  "${ns[@]}" ip link set lo up
  "${ns[@]}" ip addr replace "$NODE_IP/30" dev kiln-n
  "${ns[@]}" ip link set kiln-n up
  "${ns[@]}" ip route replace blackhole default
  "${ns[@]}" ip route replace "$SERVICE_CIDR" dev lo src "$NODE_IP"
  # Pods reach the node's address (where the apiserver is) through the bridge
  # gateway, which the CNI bridge plugin would otherwise enable itself.
  "${ns[@]}" sysctl -qw net.ipv4.ip_forward=1
}

# The cluster's OCI registry: Debian's docker-registry (distribution 2.8) as a host process in the
# network namespace at $REGISTRY_ADDR, plain HTTP, storage in $REGISTRY_DIR (so a test can flip a
# byte in a blob: $REGISTRY_DIR/docker/registry/v2/blobs/sha256/<ab>/<hex>/data).
start_registry() {
  alive registry && return 0
  mkdir -p "$REGISTRY_DIR"
  cat >"$STATE/registry.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  secret: kiln-e2e-registry
YAML
  start registry /usr/bin/docker-registry serve "$STATE/registry.yml"
}

start_etcd() {
  alive etcd && return 0
  mkdir -p "$STATE/etcd"
  # No fsync: this etcd holds throwaway test state and shares a slow disk.
  # KILN_E2E_ETCD: another etcd binary, e.g. to check a distribution's.
  start etcd "${KILN_E2E_ETCD:-$K8S_BIN/etcd}" --name kiln-e2e --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster kiln-e2e=http://127.0.0.1:2380 --unsafe-no-fsync \
    --listen-metrics-urls http://127.0.0.1:2381 --log-level warn
}

start_apiserver() {
  alive kube-apiserver && return 0
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --requestheader-client-ca-file="$PKI/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --allow-privileged=true --profiling=false --v=1
}

start_controller_manager() {
  alive kube-controller-manager && return 0
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address=127.0.0.1 --service-cluster-ip-range="$SERVICE_CIDR" --v=1
}

start_scheduler() {
  alive kube-scheduler && return 0
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --v=1
}

start_containerd() {
  alive "containerd$N_SUFFIX" && return 0
  local d=$N_DIR/containerd
  mkdir -p "$d" "$N_DIR/cni/net.d" "$N_DIR/run"
  cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$N_DIR/run/containerd"
[grpc]
  address = "$N_SOCK"
[ttrpc]
  address = "$N_SOCK.ttrpc"
[debug]
  address = "$N_SOCK.debug"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: never lower a container's oom_score_adj.
  restrict_oom_score_adj = true
  # pod network namespaces under the state dir, not /run/netns, so down finds them.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N_DIR/cni/net.d"
  # Registry hosts: the cluster's registry, plain HTTP (certs.d/$REGISTRY_ADDR/hosts.toml).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/certs.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
EOF
  # The kubelet pulls images pushed to the cluster's registry (scripts/push-images.sh
  # --plain-http) over plain HTTP; every other registry is unreachable from the cluster anyway.
  mkdir -p "$d/certs.d/$REGISTRY_ADDR"
  cat >"$d/certs.d/$REGISTRY_ADDR/hosts.toml" <<EOF
server = "http://$REGISTRY_ADDR"
[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$N_DIR/cni/net.d/10-kiln.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kiln-e2e",
  "plugins": [{
    "type": "bridge",
    "bridge": "cni0",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": "$N_POD_CIDR"}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "$N_DIR/cni/ipam"
    }
  }]
}
EOF
  start "containerd$N_SUFFIX" "$(command -v containerd)" --config "$d/config.toml" --log-level warn
}

ctr_() { ctr --address "$N_SOCK" -n k8s.io "$@"; }

start_kubelet() {
  alive "kubelet$N_SUFFIX" && return 0
  local d=$N_DIR/kubelet kubeconfig=$STATE/kubelet.kubeconfig
  ((N_INDEX == 1)) || kubeconfig=$STATE/kubelet-$N_NAME.kubeconfig
  mkdir -p "$d/pki" "$N_DIR/pod-logs"
  cat >"$d/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_NAME${N_CGROUP:+/$N_CGROUP}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$N_SOCK
address: $N_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
resolvConf: /etc/resolv.conf
podLogsDir: $N_DIR/pod-logs
# Test images are imported, never pulled: keep them however full the disk gets.
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
maxPods: 110
EOF
  start "kubelet$N_SUFFIX" "$K8S_BIN/kubelet" --config="$d/config.yaml" \
    --kubeconfig="$kubeconfig" --root-dir="$d/root" --cert-dir="$d/pki" \
    --hostname-override="$N_NAME" --node-ip="$N_IP" --v=1
}

start_kube_proxy() {
  alive "kube-proxy$N_SUFFIX" && return 0
  mkdir -p "$N_DIR"
  cat >"$N_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$STATE/kube-proxy.kubeconfig"}
hostnameOverride: $N_NAME
clusterCIDR: $CLUSTER_CIDR
# Zero: leave the (host-wide, read-only here) conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
  start "kube-proxy$N_SUFFIX" "$K8S_BIN/kube-proxy" --config="$N_DIR/kube-proxy.yaml" --v=1
}
