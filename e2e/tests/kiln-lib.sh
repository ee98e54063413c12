# shellcheck shell=bash
# Helpers for the tests that install kiln with its Helm chart (chart.sh, kiln.sh): the images
# built from this checkout's binaries and the install itself. Source after lib.sh.
REPO=$(cd "$E2E_DIR/.." && pwd)
# Tag of the images built here; the chart runs them with imagePullPolicy Never.
KILN_TAG=e2e

# kiln_bin NAME: $KILN_E2E_OPERATOR_BIN / $KILN_E2E_AGENT_BIN when set (the shared target
# directory may hold another checkout's build), else the newer of target/{release,debug}/NAME.
kiln_bin() {
  local override
  case $1 in
    kiln-operator) override=${KILN_E2E_OPERATOR_BIN:-} ;;
    kiln-agent) override=${KILN_E2E_AGENT_BIN:-} ;;
  esac
  [[ -z ${override:-} ]] || { echo "$override"; return; }
  local b newest=
  for b in "$REPO/target/release/$1" "$REPO/target/debug/$1"; do
    [[ -x $b && ( -z $newest || $b -nt $newest ) ]] && newest=$b
  done
  [[ -n $newest ]] || fail "$1 not built; run cargo build --bins"
  echo "$newest"
}

# kiln_images DIR: kiln/operator:e2e and kiln/agent:e2e, each the stripped binary at
# /bin/NAME (plus CA certificates for https sources), built by build-image and loaded.
kiln_images() {
  local dir=$1 name
  for name in operator agent; do
    strip -o "$dir/kiln-$name" "$(kiln_bin "kiln-$name")"
    "$E2E_DIR/build-image" --name "kiln/$name:$KILN_TAG" --out "$dir/$name.tar" \
      --add /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt "$dir/kiln-$name" >/dev/null
    "$E2E_DIR/cluster" load-image "$dir/$name.tar" >/dev/null
  done
}

# kiln_fresh_crds: delete kiln's CRDs if present, so that the install under test creates them
# (Helm refuses to take over objects another release or `kubectl apply` created). Run only
# while holding the e2e lock: it deletes every kiln object in the cluster.
kiln_fresh_crds() {
  local crds
  mapfile -t crds < <(kubectl get crd -o name | grep '\.kiln\.dev$' || true)
  ((${#crds[@]} == 0)) || kubectl delete "${crds[@]}" --wait=true --timeout=120s >/dev/null
}

# kiln_install RELEASE NAMESPACE [HELM ARGS...]: the chart with the images built here.
kiln_install() {
  local rel=$1 ns=$2; shift 2
  helm install "$rel" "$REPO/charts/kiln" -n "$ns" \
    --set operator.image.tag=$KILN_TAG --set operator.image.pullPolicy=Never \
    --set agent.image.tag=$KILN_TAG --set agent.image.pullPolicy=Never \
    --set compile.retryBackoffSeconds=2 "$@"
}
