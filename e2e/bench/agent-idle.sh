#!/usr/bin/env bash
# Benchmark (not a test): what kiln itself costs on a node. Installs the chart (store on the
# cluster's registry), applies the example model with N CompiledTargets (one compile key, so one
# compile Job; the agent verifies, loads and warms each target), waits until the agent's
# KilnNode shows all N Ready, then measures the agent process over a quiet minute: resident memory
# (and its peak), CPU seconds used, and whether it wrote its KilnNode or pods. Also prints the sizes of the
# stripped binaries and of the images, as the e2e tests build them.
#
#   cargo build --release --bins          # the figures are for release binaries
#   e2e/cluster up
#   e2e/cluster run -- e2e/bench/agent-idle.sh [N]      # default 50
#
# Cleans up its release and namespace; `e2e/cluster down` removes everything else.
set -euo pipefail
N=${1:-50}
source "$(dirname "$(readlink -f "$0")")/../tests/lib.sh"
source "$E2E_DIR/tests/kiln-lib.sh"
test_namespace
NS=$TEST_NS
REL=$NS
WORK=$(mktemp -d /var/tmp/kiln-bench-idle.XXXXXX)
chmod 755 "$WORK"
REAL=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
cleanup() {
  kubectl -n "$NS" delete compiledtarget --all --wait=true --timeout=120s >/dev/null 2>&1 || true
  helm uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
die() { kubectl -n "$NS" get pods,jobs,compiledtargets >&2 || true; echo "bench failed: $*" >&2; exit 1; }

echo "== images (binaries from $(dirname "$(bin kiln-agent)"))"
kiln_images "$WORK"
for f in kiln-operator kiln-agent; do
  printf '   %-14s stripped binary %6.1f MB, image %6.1f MB compressed\n' "$f" \
    "$(echo "$(stat -c %s "$WORK/bin/$f") / 1000000" | bc -l)" "$(echo "$(stat -c %s "$WORK/$f.tar") / 1000000" | bc -l)"
done
printf '   %-14s %6.1f MB of the agent image (ONNX Runtime %s)\n' "libonnxruntime" \
  "$(echo "$(stat -c %s "$ORT_LIB") / 1000000" | bc -l)" "${ORT_IDENTITY%%@*}"

kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_up "$REL" "$NS" "kiln-bench/$NS" "$WORK" || die "kiln did not come up"

echo "== the example with $N CompiledTargets"
t0=$SECONDS
{
  awk '/^kind: CompiledTarget/{exit} {print}' "$REPO/examples/squeezenet/kiln.yaml" | sed '$d'
  for ((i = 0; i < N; i++)); do
    printf -- '---\n'
    sed -e "s/name: squeezenet-cpu/name: squeezenet-$i/" \
      <(awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' "$REPO/examples/squeezenet/kiln.yaml")
  done
} | kubectl -n "$NS" apply -f - >/dev/null || die "apply"
ready() { kubectl get kilnnode "$REAL" -o json | jq --arg ns "$NS" '[.status.targets[]? | select(.namespace == $ns and .phase == "Ready")] | length'; }
for ((i = 0; i < 1200; i++)); do
  [[ $(ready) == "$N" ]] && break
  sleep 1
done
[[ $(ready) == "$N" ]] || die "$(ready) of $N Ready after $((SECONDS - t0)) s"
echo "   $N targets Ready on $REAL $((SECONDS - t0)) s after apply"

PID=$(pgrep -f '^/bin/kiln-agent run' | head -1)
[[ -n $PID ]] || die "no agent process on this host"
sleep 15 # let the last status writes land
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
field() { awk -v f="$1:" '$1 == f {print $2 * 1024}' "/proc/$PID/status"; }
# The agent writes its KilnNode and its node's pods: a quiet minute must change neither.
writes() {
  echo "$(kubectl get kilnnode "$REAL" -o jsonpath='{.metadata.resourceVersion}') $(kubectl -n "$NS" get pods -o jsonpath='{.items[*].metadata.resourceVersion}')"
}
ticks=$(getconf CLK_TCK)
c0=$(cpu) w0=$(writes) s0=$SECONDS
sleep 60
c1=$(cpu) w1=$(writes) s1=$SECONDS
echo "== the agent serving $N targets, over $((s1 - s0)) quiet seconds"
printf '   resident memory %.1f MB (VmHWM %.1f MB; the agent resets it before each load)\n' \
  "$(echo "$(field VmRSS) / 1000000" | bc -l)" "$(echo "$(field VmHWM) / 1000000" | bc -l)"
printf '   CPU %.2f s in %d s = %.2f%% of one core\n' "$(echo "($c1 - $c0) / $ticks" | bc -l)" "$((s1 - s0))" \
  "$(echo "($c1 - $c0) / $ticks / ($s1 - $s0) * 100" | bc -l)"
[[ $w0 == "$w1" ]] && echo "   no write to the KilnNode or the pods in that time" ||
  echo "   objects the agent writes changed in that time: $w0 -> $w1"
