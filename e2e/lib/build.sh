# shellcheck shell=bash
# Builds and caches upstream binaries. Sourced by e2e/cluster after common.sh.

# go_build MODULE_DIR OUT_BIN LDFLAGS PKG...: build PKGs of the module at
# MODULE_DIR into OUT_BIN, via a temporary directory so that an interrupted
# build never leaves a half-filled cache behind.
go_build() {
  local mod=$1 out=$2 ldflags=$3; shift 3
  local tmp
  tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
  log "building $* (into $out; this is the slow, once-per-version step)"
  local start=$SECONDS
  ( cd "$mod" &&
    CGO_ENABLED=0 GOFLAGS="-mod=readonly -trimpath -buildvcs=false" \
      nice -n 19 go build -ldflags "$ldflags" -o "$tmp/" "$@" ) || { rm -rf "$tmp"; die "go build failed"; }
  # go names a binary after its package path minus any /vN suffix.
  [[ -x $tmp/server ]] && mv "$tmp/server" "$tmp/etcd"
  chmod 755 "$tmp"
  mkdir -p "$(dirname "$out")"
  rm -rf "$out"
  mv "$tmp" "$out"
  log "built in $((SECONDS - start))s"
}

build_k8s() {
  [[ -x $K8S_BIN/kubelet && -x $K8S_BIN/etcd ]] && return 0
  command -v go >/dev/null || die "go is required to build Kubernetes"
  mkdir -p "$CACHE"
  local v=${K8S_VERSION#v} ldflags="-s -w"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
    ldflags+=" -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v") -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"
  go_build "$E2E_DIR/k8s-build" "$K8S_BIN" "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl \
    go.etcd.io/etcd/server/v3
}

build_helm() {
  [[ -x $HELM_BIN/helm ]] && return 0
  mkdir -p "$CACHE"
  go_build "$E2E_DIR/helm-build" "$HELM_BIN" \
    "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
}

build_health() {
  [[ -x $HEALTH_BIN/kiln-health ]] && return 0
  mkdir -p "$CACHE"
  go_build "$E2E_DIR/health" "$HEALTH_BIN" "-s -w" .
  # go names the binary after the module's last element.
  mv "$HEALTH_BIN/health" "$HEALTH_BIN/kiln-health"
}

# build_pause: a static pause (the sandbox process of every pod), packaged as an
# OCI image tarball tagged $PAUSE_IMAGE.
build_pause() {
  [[ -f $PAUSE_DIR/pause.tar ]] && return 0
  command -v gcc >/dev/null || die "gcc is required to build pause"
  local tmp
  tmp=$(mktemp -d "$CACHE/.pause.XXXXXX")
  gcc -Os -static -o "$tmp/pause" "$E2E_DIR/pause/pause.c" || die "gcc failed (is libc6-dev installed?)"
  strip "$tmp/pause"
  "$E2E_DIR/build-image" --name "$PAUSE_IMAGE" --path /pause --entrypoint /pause --out "$tmp/pause.tar" "$tmp/pause"
  rm -rf "$PAUSE_DIR"
  mv "$tmp" "$PAUSE_DIR"
}
