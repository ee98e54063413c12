#!/usr/bin/env bash
# IREE, kiln's engine that generates code per class, on the real cluster: the chart with
# compile.image set to the compiler image (scripts/build-images.sh --images compiler: the agent
# image with IREE's compiler) and backends.iree as that script prints it. Asserts: the example's
# `backend.kind: iree` target (examples/squeezenet/iree.yaml) is compiled by a Job running the
# compiler image, never the agent image the DaemonSet runs; the build manifest in the registry
# says IREE compiled it for the class's own CPU level (the baseline where the class keys on none),
# never `host`; the node's agent (the agent image, no compiler) loads and warms it and its row is
# Ready at the class's digest; a serving pod (`kiln-agent serve` on the csi.kiln.dev volume, the
# README's Deployment) is Ready only after its own server gave the fixture's answers, and a real v2
# client (tritonclient[http]) gets the golden outputs through its Service. Then `backend: auto`
# measures IREE beside tract and ONNX Runtime in the compiler image's Job: the build manifest
# lists all three as passed candidates with their p50, and the node serves the kept one.
# Prints apply → Ready, the compile's time and module size, and auto's figures.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test serving-iree
TARGET=squeezenet-iree
NETNS=kiln-e2e

PY=$("$REPO/scripts/ensure/v2-client.sh") || skip "no v2 client: scripts/ensure/v2-client.sh needs PyPI once"
kiln_example_dirs "$WORK"
kiln_fresh_crds
kiln_images "$WORK/images" || die "images"

echo "== the compiler image: the agent image with IREE's compiler (cached by what goes into it)"
# Kept in the e2e cache under a key of what goes into it: the agent binary, the recipe and the
# compiler's environment; built only when missing (about 40 s, 210 MB compressed).
VENV=$(dirname "$("$REPO/scripts/ensure/iree.sh")") || die "scripts/ensure/iree.sh"
key=$({ cat "$(bin kiln-agent)" "$REPO/scripts/build-images.sh" "$E2E_DIR/build-image" "$REPO/scripts/ensure/iree.sh"
  stat -c %Y "$VENV/pyvenv.cfg"; } | sha256sum | cut -c1-12)
TAR=$CACHE/images/kiln-compiler-$key.tar
if [[ ! -s $TAR ]]; then
  mkdir -p "$CACHE/images" "$WORK/compiler"
  rm -f "$CACHE"/images/kiln-compiler-*.tar
  line=$(kiln_build_images "$WORK/compiler" compiler) || die "the compiler image"
  mv "$(cut -f2 <<<"$line")" "$TAR" && cut -f3 <<<"$line" >"$TAR.backends" || die "cache the compiler image"
fi
BACKENDS=$(cat "$TAR.backends")
IREE=$(tr ',' '\n' <<<"$BACKENDS" | sed -n 's/^iree=//p')
[[ -n $IREE ]] || die "scripts/build-images.sh names no iree version for the compiler image: $BACKENDS"
"$E2E_DIR/cluster" load-image "$TAR" >/dev/null || die "load the compiler image"
echo "   kiln/compiler:$KILN_TAG, iree=$IREE"

T0=$(date +%s.%N)
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" --set compile.image.repository=kiln/compiler \
  --set compile.image.tag=$KILN_TAG --set compile.image.pullPolicy=Never --set backends.iree="$IREE" ||
  die "kiln did not come up"

echo "== the iree target: compiled by the compiler image's Job for the class's CPU level"
# The ModelArtifact and the iree target; the compile Job reads the sources from a hostPath.
kubectl -n "$NS" apply -f "$REPO/examples/squeezenet/iree.yaml" >/dev/null || die "apply the iree example"
wait_for "$TARGET compiled" 300 bash -c \
  "kubectl -n '$NS' get compiledtarget '$TARGET' -o json | jq -e '.status.classes[0].artifactDigest // empty' >/dev/null"
JOBS=$(kubectl -n "$NS" get jobs -o json)
jq -e '[.items[].spec.template.spec.containers[].image] | length > 0 and all(endswith("kiln/compiler:e2e"))' <<<"$JOBS" >/dev/null ||
  die "compile Jobs ran $(jq -c '[.items[].spec.template.spec.containers[].image]' <<<"$JOBS"), not the compiler image"
AGENT_IMAGE=$(kubectl -n "$NS" get ds kiln-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
[[ $AGENT_IMAGE == *kiln/agent:e2e ]] || die "the agent DaemonSet runs $AGENT_IMAGE, not the agent image"
CT=$(kubectl -n "$NS" get compiledtarget "$TARGET" -o json)
BUILD=$(build_manifest "$(jq -r '.status.classes[0].compileKey' <<<"$CT")") || die "$BUILD"
jq -e '.backendOptions as $o | .backend == "iree" and $o.targetCpu == (.class["kiln.dev/cpu-level"] // "x86-64")
  and ($o.compilerFlags | contains("--iree-llvmcpu-target-cpu=" + $o.targetCpu))
  and ($o.compilerFlags | contains("host") | not) and .parityMaxAbsError <= 1e-5' <<<"$BUILD" >/dev/null ||
  die "iree build manifest: $(jq -c '{backend, class, backendOptions, parityMaxAbsError}' <<<"$BUILD")"
echo "   $(jq -r '"class \(.class | tostring): target CPU \(.backendOptions.targetCpu), compiled in \(.compileSeconds * 100 | round / 100) s, module \(.backendOptions.moduleBytes) bytes"' <<<"$BUILD")"

echo "== loaded by the agent's built-in runtime; a serving pod checked through its endpoint"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1
sed -e "s|IMAGE|$AGENT_IMAGE|" -e "s|NAMESPACE|$NS|" -e "s|squeezenet|$TARGET|g" "$REPO/examples/serving/deployment.yaml" |
  sed 's|^          args: \[serve|          imagePullPolicy: Never\n          args: [serve|' >"$WORK/serving.yaml"
kubectl -n "$NS" apply -f "$WORK/serving.yaml" >/dev/null || die "the restricted namespace refused the serving Deployment"
pod() { kubectl -n "$NS" get pods -l "app=$TARGET" -o json | jq '.items[0] // empty'; }
serving_ready pod "$T0"
ROW=$(kubectl get kilnnode "$REAL" -o json | jq --arg ns "$NS" --arg t "$TARGET" '.status.targets[] | select(.namespace == $ns and .name == $t)')
[[ $(jq -r .artifactDigest <<<"$ROW") == *"$(jq -r '.status.classes[0].artifactDigest' <<<"$CT")" ]] ||
  die "the node serves another artifact than the class's: $ROW"
IP=$(kubectl -n "$NS" get svc "$TARGET" -o jsonpath='{.spec.clusterIP}')
check=$(ip netns exec "$NETNS" "$PY" "$REPO/e2e/testdata/v2_check.py" "$IP:8000" "$TARGET" "$WORK/sources/fixture-v1.safetensors" 1e-5 1e-4) ||
  die "tritonclient through the Service: $check"
echo "   v2 client through the Service: $check"

echo "== backend auto: IREE measured beside tract and ONNX Runtime in the compiler image's Job"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce- >/dev/null 2>&1
t0=$SECONDS
awk '/^kind: CompiledTarget/{p=1; print "apiVersion: kiln.dev/v1alpha1"} p' "$REPO/examples/squeezenet/auto.yaml" |
  kubectl -n "$NS" apply -f - >/dev/null || die "apply the auto target"
wait_for "squeezenet-auto Ready on $REAL" 300 bash -c "[[ \$(kubectl get kilnnode $REAL -o json | jq -r --arg ns $NS '.status.targets[]? | select(.namespace == \$ns and .name == \"squeezenet-auto\") | .phase') == Ready ]]"
AUTO=$(kubectl -n "$NS" get compiledtarget squeezenet-auto -o json)
engine=$(jq -r '.status.classes[0].engine' <<<"$AUTO")
BUILD=$(build_manifest "$(jq -r '.status.classes[0].compileKey' <<<"$AUTO")") || die "$BUILD"
jq -e --arg e "$engine" '.selection.engine == $e and ([.selection.candidates[] | select(.passed and .p50Seconds > 0) | .engine] | sort ==
  ["iree", "onnxruntime/cpu", "tract"]) and (.backend == ($e | split("/") | .[0]))' <<<"$BUILD" >/dev/null ||
  die "auto build manifest: $(jq -c '{backend, selection}' <<<"$BUILD")"
echo "   Ready $((SECONDS - t0)) s after apply on $engine; p50 $(jq -r '[.selection.candidates[] | "\(.engine) \(.p50Seconds * 1e5 | round / 100) ms"] | join(", ")' <<<"$BUILD")"
echo "serving-iree: compiled by the compiler image for the class's CPU, served by the agent image's runtime, checked through the pod's endpoint; auto measured IREE"
