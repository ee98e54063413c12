# shellcheck shell=bash
# Configuration and command lines of the cluster's components. Sourced by
# e2e/cluster; start order: network, etcd, apiserver, then the node.
# A running component's files are left alone: kube-proxy exits when its
# configuration file changes.

CTR_SOCK=$STATE/run/containerd/containerd.sock

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
  alive containerd && return 0
  local d=$STATE/containerd
  mkdir -p "$d" "$STATE/cni/net.d" "$STATE/run"
  cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$STATE/run/containerd"
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$CTR_SOCK.ttrpc"
[debug]
  address = "$CTR_SOCK.debug"
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
    conf_dir = "$STATE/cni/net.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
EOF
  cat >"$STATE/cni/net.d/10-kiln.conflist" <<EOF
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
      "ranges": [[{"subnet": "$POD_CIDR"}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "$STATE/cni/ipam"
    }
  }]
}
EOF
  start containerd "$(command -v containerd)" --config "$d/config.toml" --log-level warn
}

ctr_() { ctr --address "$CTR_SOCK" -n k8s.io "$@"; }

start_kubelet() {
  alive kubelet && return 0
  local d=$STATE/kubelet
  mkdir -p "$d/pki" "$STATE/pod-logs"
  cat >"$d/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_NAME
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CTR_SOCK
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
resolvConf: /etc/resolv.conf
podLogsDir: $STATE/pod-logs
# Test images are imported, never pulled: keep them however full the disk gets.
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
maxPods: 110
EOF
  start kubelet "$K8S_BIN/kubelet" --config="$d/config.yaml" \
    --kubeconfig="$STATE/kubelet.kubeconfig" --root-dir="$d/root" --cert-dir="$d/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
}

start_kube_proxy() {
  alive kube-proxy && return 0
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$STATE/kube-proxy.kubeconfig"}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
# Zero: leave the (host-wide, read-only here) conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
  start kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml" --v=1
}
