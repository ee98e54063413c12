# shellcheck shell=bash
# Certificates, keys and kubeconfigs for one cluster, made with openssl.
# Sourced by e2e/cluster. Everything lands in $STATE/pki and dies with `down`.

PKI=$STATE/pki

# issue NAME CN O EKU [SAN]: an ECDSA P-256 key and a CA-signed certificate.
issue() {
  local name=$1 cn=$2 o=$3 eku=$4 san=${5:-}
  local subj="/CN=$cn"
  [[ -n $o ]] && subj="/O=$o$subj"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 30 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig NAME CERT: a kubeconfig that authenticates with $PKI/CERT.{crt,key}.
kubeconfig() {
  local out=$STATE/$1.kubeconfig cert=$2
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kiln-e2e
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$cert.crt")
    client-key-data: $(base64 -w0 "$PKI/$cert.key")
contexts:
- name: kiln-e2e
  context: {cluster: kiln-e2e, user: $1, namespace: default}
current-context: kiln-e2e
EOF
  chmod 600 "$out"
}

make_pki() {
  [[ -f $PKI/done ]] && return 0
  mkdir -p "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=kiln-e2e-ca" -days 30 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/ca.crt" 2>/dev/null
  issue apiserver kube-apiserver "" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$NODE_IP,IP:$KUBERNETES_SVC_IP,IP:127.0.0.1"
  # system:masters: the kubelet authorises the apiserver's log/exec proxying by webhook.
  issue apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
  # The aggregation layer's client; trusted as a request-header source by name only.
  issue front-proxy-client front-proxy-client "" clientAuth
  issue admin kiln-e2e-admin system:masters clientAuth
  issue controller-manager system:kube-controller-manager "" clientAuth
  issue scheduler system:kube-scheduler "" clientAuth
  issue kube-proxy system:kube-proxy "" clientAuth
  issue kubelet "system:node:$NODE_NAME" system:nodes clientAuth
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet
  touch "$PKI/done"
}

# node_pki: the kubelet certificate and kubeconfig of the current extra node (node_env).
node_pki() {
  [[ -f $STATE/kubelet-$N_NAME.kubeconfig ]] && return 0
  issue "kubelet-$N_NAME" "system:node:$N_NAME" system:nodes clientAuth
  kubeconfig "kubelet-$N_NAME" "kubelet-$N_NAME"
}
