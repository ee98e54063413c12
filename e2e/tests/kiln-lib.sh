# shellcheck shell=bash
# Helpers for the tests that install kiln with its Helm chart (chart.sh, kiln.sh): the images
# built from this checkout's binaries and the install itself. Source after lib.sh.
REPO=$(cd "$E2E_DIR/.." && pwd)
# Tag of the images built here; the chart runs them with imagePullPolicy Never.
KILN_TAG=e2e

# The ONNX Runtime library the agent image carries (scripts/ensure-onnxruntime.sh: the pinned
# PyPI wheel's, cached; scripts/build-images.sh puts it in the image) and what the operator keys
# on (chart backends.onnxruntime: VERSION@sha256:<library>).
ORT_LIB=$("$REPO/scripts/ensure-onnxruntime.sh")
ORT_IDENTITY="${ORT_LIB##*libonnxruntime.so.}@sha256:$(sha256sum "$ORT_LIB" | cut -d' ' -f1)"

# kiln_images DIR: kiln/operator:e2e, kiln/agent:e2e and kiln/csi:e2e (the CSI node plugin),
# built by scripts/build-images.sh (the
# recipe push-images.sh and the Containerfile use: the agent with ONNX Runtime, ORT_DYLIB_PATH
# set and ORT_DISABLE_TELEMETRY=1) from this checkout's binaries (see bin), loaded into the node.
kiln_images() {
  local built name path _
  built=$(kiln_build_images "$1" operator,agent,csi) || return 1
  while IFS=$'\t' read -r name path _; do
    "$E2E_DIR/cluster" load-image "$path" >/dev/null || return 1
  done <<<"$built"
}

# kiln_build_images DIR LIST: scripts/build-images.sh of the images in LIST, named kiln/NAME:e2e,
# into DIR (DIR/kiln-NAME.tar); its output lines (NAME, tar, backends) on stdout.
kiln_build_images() {
  local bins=()
  [[ ,$2, != *,operator,* ]] || bins+=(--operator-bin "$(bin kiln-operator)")
  [[ ,$2, != *,agent* && ,$2, != *,compiler,* ]] || bins+=(--agent-bin "$(bin kiln-agent)")
  [[ ,$2, != *,csi,* ]] || bins+=(--csi-bin "$(bin kiln-csi)")
  "$REPO/scripts/build-images.sh" --images "$2" --tag "$KILN_TAG" "${bins[@]}" "$1"
}

# kiln_gpu_image_tar DIR: DIR/kiln-agent-gpu.tar, the GPU variant of the agent image
# (kiln/agent-gpu:e2e), not loaded: the stripped kiln-agent (see bin) with the onnxruntime-gpu
# library, its CUDA provider and the CUDA 13 / cuDNN 9 libraries of
# scripts/ensure/onnxruntime-gpu.sh in a layer of their own at $ORT_GPU_IN_IMAGE, which is the
# image's library search path (LD_LIBRARY_PATH: the provider finds its CUDA libraries there);
# libcuda.so.1 is left to the NVIDIA container runtime, which mounts the node's driver. The
# chart runs it on GPU nodes (agent.gpu). Fetches 1.2 GB on first use; builds in about a minute.
# Its kiln-agent is the CUDA build of llama.cpp in $KILN_E2E_CUDA_AGENT (what
# scripts/build-agent-cuda.sh prints; default target/cuda/agent when it holds one), with
# llama.cpp's libraries at $LLAMA_IN_IMAGE; without one, the CPU build (see bin), whose
# llama.cpp runs on the CPU only. kiln_cuda_agent prints that directory, or fails.
ORT_GPU_IN_IMAGE=/usr/lib/onnxruntime LLAMA_IN_IMAGE=/usr/lib/llama
kiln_cuda_agent() {
  local d=${KILN_E2E_CUDA_AGENT:-$REPO/target/cuda/agent}
  [[ -x $d/kiln-agent ]] && compgen -G "$d/libggml-cuda.so*" >/dev/null && echo "$d"
}
kiln_gpu_image_tar() {
  local cuda
  if cuda=$(kiln_cuda_agent); then
    "$REPO/scripts/build-images.sh" --images agent-gpu --tag "$KILN_TAG" --cuda-agent "$cuda" "$1" >/dev/null
  else
    kiln_build_images "$1" agent-gpu >/dev/null
  fi
}

# kiln_example_dirs DIR: DIR/sources holding the example model and fixture (the chart's
# sources.hostPath, read-only to the pods) and an empty DIR/cache (agent.cacheHostPath).
kiln_example_dirs() {
  install -d -m 755 "$1/sources" "$1/cache"
  cp "$REPO/examples/squeezenet/model.onnx" "$REPO/examples/squeezenet/fixture-v1.safetensors" "$1/sources/"
  chmod 644 "$1/sources/"*
}

# kiln_diagnose NAMESPACE NODE: what a failing kiln test shows on stderr: the namespace's
# objects, the node's KilnNode rows, the components' last log lines and the events.
kiln_diagnose() {
  kubectl -n "$1" get all,compiledtargets -o wide >&2 || true
  kubectl get kilnnode "$2" -o json 2>/dev/null | jq '.status.targets' >&2 || true
  kubectl -n "$1" logs deploy/kiln-operator --tail=20 >&2 || true
  kubectl -n "$1" logs ds/kiln-agent --tail=30 >&2 || true
  dump "$1" >&2
}

# kiln_fresh_crds: delete kiln's CRDs if present, so that the install under test creates them
# (Helm refuses to take over objects another release or `kubectl apply` created). Run only
# while holding the e2e lock: it deletes every kiln object in the cluster.
kiln_fresh_crds() {
  local crds
  mapfile -t crds < <(kubectl get crd -o name | grep '\.kiln\.dev$' || true)
  ((${#crds[@]} == 0)) || kubectl delete "${crds[@]}" --wait=true --timeout=120s >/dev/null
}

# The e2e kubelet's root directory (its --root-dir, e2e/lib/components.sh), where the CSI node
# plugin finds pods' volumes and registers (chart csi.kubeletDir).
KUBELET_DIR=$STATE/kubelet/root

# kiln_install RELEASE NAMESPACE [HELM ARGS...]: the chart with the images built here.
kiln_install() {
  local rel=$1 ns=$2 keys; shift 2
  # The attestation key pair the chart expects (attestation.existingSecret, on by default).
  keys=$(mktemp -d)
  "$(bin kiln-agent)" keygen "$keys/k" >/dev/null || return 1
  kubectl -n "$ns" create secret generic kiln-signing --from-file="$keys/k" >/dev/null || return 1
  rm -rf "$keys"
  helm install "$rel" "$REPO/charts/kiln" -n "$ns" \
    --set operator.image.tag=$KILN_TAG --set operator.image.pullPolicy=Never \
    --set agent.image.tag=$KILN_TAG --set agent.image.pullPolicy=Never \
    --set csi.image.tag=$KILN_TAG --set csi.image.pullPolicy=Never \
    --set compile.retryBackoffSeconds=2 --set backends.onnxruntime="$ORT_IDENTITY" \
    --set csi.kubeletDir="$KUBELET_DIR" "$@"
}

# kiln_up RELEASE NAMESPACE REPOSITORY WORK [HELM ARGS...]: kiln_install with the store on the
# cluster's registry at REPOSITORY and the sources and the agent's node cache under WORK, then
# the operator Available and the agent DaemonSet rolled out. Says on stderr what failed.
kiln_up() {
  local rel=$1 ns=$2 repository=$3 work=$4
  shift 4
  kiln_install "$rel" "$ns" --set store.url="oci://$REGISTRY_ADDR/$repository" --set store.insecure=true \
    --set sources.hostPath="$work/sources" --set agent.cacheHostPath="$work/cache" "$@" >/dev/null ||
    { echo "helm install failed" >&2; return 1; }
  kubectl -n "$ns" wait --for=condition=Available deploy/kiln-operator --timeout=120s >/dev/null ||
    { echo "operator not Available" >&2; return 1; }
  kubectl -n "$ns" rollout status ds/kiln-agent --timeout=120s >/dev/null ||
    { echo "agent DaemonSet not ready" >&2; return 1; }
}

# example_target NAME PROFILE [ITERATIONS] [ROLLOUT]: a CompiledTarget of the example model as
# YAML, with one profile named PROFILE (batch 1: the same model, a new compile key per name),
# ITERATIONS warmup iterations (default 5) and, when given, ROLLOUT (flow YAML) as spec.rollout.
example_target() {
  cat <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: tract}
  profiles: [{name: $2, dims: {batch: 1}}]
  warmup: {iterations: ${3:-5}, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}
${4:+  rollout: $4}
YAML
}

# build_manifest KEY: the build manifest the store at $REPOSITORY on the cluster's registry holds
# under the compile key KEY (the config blob of the manifest tagged KEY); what failed otherwise.
build_manifest() {
  local manifest
  manifest=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$1") ||
    { echo "no manifest tagged $1"; return 1; }
  curl -fsS "http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/$(jq -r '.config.digest' <<<"$manifest")" ||
    { echo "no config blob for $1"; return 1; }
}

# event_count NAMESPACE REASON: how many Events of REASON the namespace saw, counting every
# occurrence of an event series (the operator's recorder folds repeats of a reason into one
# Event with series.count).
event_count() {
  kubectl -n "$1" get events --field-selector "reason=$2" -o json | jq '[.items[] | (.series.count // .count // 1)] | add // 0'
}

# flip FILE: xor one byte in the middle of FILE (twice restores it).
flip() {
  python3 - "$1" <<'PY'
import os, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(os.path.getsize(sys.argv[1]) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 1]))
PY
}

# serving_pod NAMESPACE TARGET NODE [NAME]: pod NAME (default "serve") on NODE, annotated for
# TARGET and gated on kiln.dev/warm, as a serving workload declares itself to kiln.
serving_pod() {
  kubectl -n "$1" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ${4:-serve}
  annotations: {kiln.dev/target: $2}
spec:
  readinessGates: [{conditionType: kiln.dev/warm}]
  nodeName: $3
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - {name: serve, image: $BUSYBOX_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}
YAML
}

# gated_pod NAME TARGET ANNOTATIONS IMAGE ARGS PROBE-PATH PORT: the YAML of a pod on $REAL that
# a namespace enforcing Pod Security "restricted" admits, gated on kiln.dev/warm, labelled
# app=NAME, with TARGET's csi.kiln.dev volume at /model: ANNOTATIONS are the flow-map entries
# after kiln.dev/target (the protocol, port, model name), ARGS the server's flow list, and its
# readiness probe GETs PROBE-PATH on PORT.
gated_pod() {
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app: $1}
  annotations: {kiln.dev/target: $2, $3}
spec:
  readinessGates: [{conditionType: kiln.dev/warm}]
  nodeName: $REAL
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: server
      image: $4
      imagePullPolicy: Never
      args: $5
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      readinessProbe: {httpGet: {path: "$6", port: $7}, periodSeconds: 2}
      volumeMounts: [{name: model, mountPath: /model, readOnly: true}]
  volumes:
    - {name: model, csi: {driver: csi.kiln.dev, readOnly: true, volumeAttributes: {target: $2}}}
YAML
}

# smollm2_fixture: the real SmolLM2-135M Q4_1 (scripts/ensure/llm-models.sh's directory in $MODELS)
# as $WORK/sources/smollm2.gguf, and its chat fixture made by kiln's own reference run
# (`kiln-agent fixtures --reference llamacpp --chat`, 8 tokens) beside it; sets FIX (its path)
# and LEN (the prompt's length, for the target's profile).
smollm2_fixture() {
  cp "$MODELS/smollm2-135m-q4_1.gguf" "$WORK/sources/smollm2.gguf"
  cat >"$WORK/chat.json" <<'JSON'
[{"role": "system", "content": "You answer in one short sentence."},
 {"role": "user", "content": "What does a kiln do?"}]
JSON
  FIX=$WORK/sources/smollm2-fixture-v1.safetensors
  "$(bin kiln-agent)" fixtures --reference llamacpp --fixture-version v1 --chat "$WORK/chat.json" \
    --generate 8 --model "$WORK/sources/smollm2.gguf" --out "$FIX" >/dev/null 2>"$WORK/fixtures.log" ||
    die "kiln-agent fixtures: $(tail -5 "$WORK/fixtures.log")"
  chmod 644 "$WORK/sources/"*
  LEN=$(python3 -c 'import json,struct,sys; r=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",r[:8])[0]
print(json.loads(r[8:8+n])["input/prompt"]["shape"][0])' "$FIX")
}

# smollm2_target NAME: the ModelArtifact smollm2 of smollm2_fixture's files and the llamacpp
# CompiledTarget NAME on it (one profile of the prompt's length; logits within 1e-3, tokens
# exact), applied in $NS; waits for its compile Job (whose hostPath sources restricted forbids),
# then enforces Pod Security "restricted" on $NS.
smollm2_target() {
  size() { stat -c %s "$1"; }
  sha() { sha256sum "$1" | cut -d' ' -f1; }
  kubectl -n "$NS" apply -f - >/dev/null <<YAML || die "apply the model"
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: smollm2}
spec:
  source: {uri: "file://smollm2.gguf", sha256: "$(sha "$WORK/sources/smollm2.gguf")", size: $(size "$WORK/sources/smollm2.gguf")}
  format: gguf
  inputs:
    - {name: prompt, dtype: i32, dims: [{symbol: len, min: 1, max: 120}]}
    - {name: generate, dtype: i32, dims: [{size: 1}]}
  fixtures:
    - {version: v1, uri: "file://smollm2-fixture-v1.safetensors", sha256: "$(sha "$FIX")"}
  license: Apache-2.0
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: smollm2}
  backend: {kind: llamacpp, llamacpp: {contextLength: 128}}
  profiles: [{name: chat, dims: {len: $LEN}}]
  warmup:
    iterations: 3
    fixtureVersion: v1
    outputs:
      - {name: logits, atol: 1.0e-3, rtol: 1.0e-3}
      - {name: tokens, atol: 0, rtol: 0}
YAML
  wait_for "compile Job done" 300 bash -c \
    "kubectl -n '$NS' get jobs -o json | jq -e '.items | length > 0 and all(.status.succeeded == 1)' >/dev/null"
  kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1
}

# cond POD-JSON TYPE FIELD: a field of one of the pod's conditions.
cond() { jq -r --arg t "$2" '.status.conditions[]? | select(.type == $t) | .'"$3" <<<"$1"; }

# serving_ready POD-CMD T0: polls, every 0.5 s for up to 300 s, the serving pod whose JSON
# POD-CMD prints and the node's row for $TARGET in $NS; dies when the pod is Ready while the row
# is not, or never Ready, or Ready without a check through its server. Sets P (the pod's JSON),
# MESSAGE (its kiln.dev/warm message) and SEEN (the gate's reasons, in order), and prints apply
# (T0) → pod Ready, row Ready → pod Ready and the reasons seen.
serving_ready() {
  local t0=$2 t_row='' t_pod='' phase now reason end=$((SECONDS + 300))
  SEEN=()
  while ((SECONDS < end)); do
    P=$($1)
    phase=$(kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq -r --arg ns "$NS" --arg t "$TARGET" \
      '.status.targets[]? | select(.namespace == $ns and .name == $t) | .phase')
    now=$(date +%s.%N)
    [[ $phase == Ready && -z $t_row ]] && t_row=$now
    reason=$(cond "$P" kiln.dev/warm reason)
    [[ -n $reason && " ${SEEN[*]} " != *" $reason "* ]] && SEEN+=("$reason")
    if [[ -n $P && $(cond "$P" Ready status) == True ]]; then
      [[ -n $t_row ]] || die "serving pod Ready while the row is ${phase:-absent}"
      t_pod=$now
      break
    fi
    sleep 0.5
  done
  [[ -n $t_pod ]] || die "serving pod not Ready within 300 s (gate reasons seen: ${SEEN[*]}; last: $(cond "$P" kiln.dev/warm message))"
  MESSAGE=$(cond "$P" kiln.dev/warm message)
  [[ $MESSAGE == *"requests through the server within tolerance"* ]] || die "warm without a check through the server: $MESSAGE"
  [[ " ${SEEN[*]} " == *" WarmingServer "* || " ${SEEN[*]} " == *" WaitingForServer "* ]] ||
    die "the gate never waited for the server (reasons seen: ${SEEN[*]})"
  printf '   apply → serving pod Ready: %.1f s (row Ready → pod Ready %.1f s); gate reasons seen: %s\n' \
    "$(echo "$t_pod - $t0" | bc)" "$(echo "$t_pod - $t_row" | bc)" "${SEEN[*]}"
  echo "   $MESSAGE"
}

# new_client_first REPORT LIMIT: e2e/testdata/first_request.py's REPORT (new clients of a warm
# process, the first after the server sat idle: the median of their first requests, .first, each
# of them, .firsts, and the first client's own p50, .p50), printed exactly with the client
# process's very first request (.processFirst, its own imports and first encodings); dies when
# the median is above LIMIT (the goal is 1.2x; the margin is for a 2-core machine that also runs
# the cluster, where one first request alone was 1.73x once and 1.2x the run before).
new_client_first() {
  local ratio
  ratio=$(jq -r '.first / .p50' <<<"$1")
  printf '   new clients after %ss idle: first requests %s ms (median %.1f), p50 %.1f ms: %.2fx (goal 1.2x, fails above %s); the process'"'"'s first %.1f ms\n' \
    "$(jq -r .idleSeconds <<<"$1")" "$(jq -r '[.firsts[] * 1000 | . * 10 | round / 10] | join(", ")' <<<"$1")" \
    "$(jq -r '.first * 1000' <<<"$1")" "$(jq -r '.p50 * 1000' <<<"$1")" "$ratio" "$2" "$(jq -r '.processFirst * 1000' <<<"$1")"
  (($(echo "$ratio <= $2" | bc -l))) || die "new clients' first requests after Ready took ${ratio}x the p50 (median of $(jq -r '.firsts | length' <<<"$1"))"
}

# gate_refuses POD REASON WANT SECONDS: within SECONDS the gated pod POD's kiln.dev/warm reason is
# REASON, its message holds WANT and the pod is not Ready; prints the message and deletes POD.
gate_refuses() {
  wait_for "$1: $2" "$4" bash -c \
    "[[ \$(kubectl -n '$NS' get pod '$1' -o jsonpath='{.status.conditions[?(@.type==\"kiln.dev/warm\")].reason}') == $2 ]]"
  local msg
  msg=$(kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].message}')
  [[ $msg == *"$3"* ]] || die "$1: the reason does not say $3: $msg"
  [[ $(kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') != True ]] ||
    die "$1 is Ready"
  echo "   $1: $2: $(cut -c1-200 <<<"$msg")"
  kubectl -n "$NS" delete pod "$1" --wait=false >/dev/null
}

# first_after_ready CHECK FIELDS: a client's check through the Service (CHECK, its JSON line),
# summarised by the jq filter FIELDS, and its request's latency (.seconds), the first after
# Ready, against the p50 the agent measured through the server ($MESSAGE of serving_ready).
first_after_ready() {
  local first p50
  first=$(jq -r .seconds <<<"$1")
  p50=$(sed -n 's/.*p50 \([0-9.]*\) ms.*/\1/p' <<<"$MESSAGE")
  printf '   %s; first request after Ready %.1f ms, p50 through the server %s ms: %.2fx\n' \
    "$(jq -c "$2" <<<"$1")" "$(echo "$first * 1000" | bc -l)" "$p50" "$(echo "$first * 1000 / $p50" | bc -l)"
}

# kiln_test NAME: the set-up of a test that installs kiln with its chart: a test namespace NS
# (also the release REL and the registry repository REPOSITORY=kiln-e2e/NS), a directory WORK,
# the real node REAL, and an EXIT trap that runs the test's own `teardown` first when it defines
# one, then deletes the targets, uninstalls the release, deletes the node's KilnNode and the
# namespace, and removes WORK. `die` diagnoses, then fails.
kiln_test() {
  test_namespace
  NS=$TEST_NS
  REL=$NS
  REPOSITORY=kiln-e2e/$NS
  WORK=$(mktemp -d "/var/tmp/kiln-e2e-$1.XXXXXX")
  chmod 755 "$WORK"
  REAL=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
  trap kiln_cleanup EXIT
}
kiln_cleanup() {
  if declare -F teardown >/dev/null; then teardown; fi
  kubectl -n "$NS" delete compiledtarget --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  helm uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
die() {
  kiln_diagnose "$NS" "$REAL"
  fail "$*"
}

# kiln_readme_script REGISTRY NAMESPACE [PUSH ARGS] [HELM ARGS]: README.md's "In a cluster" block
# (its first ```sh block), as the kiln test runs it: the REGISTRY= and NAMESPACE= lines set to
# the given values, target/release/kiln-agent replaced by the kiln-agent under test, PUSH ARGS
# appended to the scripts/push-images.sh command and HELM ARGS to the helm install command (each
# one string, already quoted for the shell). Everything else is the README's text. Fails, saying
# what moved, when the block lacks one of those anchors: the README and the test drifted apart.
kiln_readme_script() {
  python3 - "$REPO/README.md" "$@" "$(bin kiln-agent)" <<'PY'
import re, shlex, sys
readme, registry, namespace, push_args, helm_args, agent = sys.argv[1:]
text = open(readme).read()
section = re.search(r"^## In a cluster\n(.*?)(?=^## )", text, re.S | re.M)
block = section and re.search(r"^```sh\n(.*?)^```$", section.group(1), re.S | re.M)
if not block:
    sys.exit("README.md: no ```sh block in the section '## In a cluster'")
lines = block.group(1).splitlines()

def command(prefix):
    """Indices of the lines of the one command starting with `prefix` (with continuations)."""
    starts = [i for i, l in enumerate(lines) if l.startswith(prefix)]
    if len(starts) != 1:
        sys.exit(f"README.md's cluster block has {len(starts)} lines starting with {prefix!r}; "
                 "e2e/tests/kiln-lib.sh (kiln_readme_script) expects one: update the one that drifted")
    end = starts[0]
    while lines[end].rstrip().endswith("\\") or lines[end].rstrip().endswith("&&"):
        end += 1
    return end

for var, value in (("REGISTRY", registry), ("NAMESPACE", namespace)):
    i = command(f"{var}=")
    lines[i] = f"{var}={shlex.quote(value)}"
for prefix, extra in (("scripts/push-images.sh ", push_args), ("helm install ", helm_args)):
    i = command(prefix)
    if " #" in lines[i]:
        sys.exit(f"README.md's cluster block ends the {prefix.strip()!r} command with a comment; "
                 "kiln_readme_script appends options there: move the comment above it")
    lines[i] = f"{lines[i].rstrip()} {extra}"
script = "\n".join(lines) + "\n"
if "target/release/kiln-agent" not in script:
    sys.exit("README.md's cluster block no longer runs target/release/kiln-agent (keygen); update kiln_readme_script")
print(script.replace("target/release/kiln-agent", shlex.quote(agent)), end="")
PY
}

# kiln_readme_install WORK REGISTRY NAMESPACE PUSH-ARGS HELM-ARGS: runs kiln_readme_script in
# WORK/readme, a directory holding links to the work tree's scripts, charts and examples (the
# block writes keys/ and kiln-images.yaml where it runs), with bash -euo pipefail as a user's
# terminal would stop at the first error. The script is WORK/readme/install.sh, its output on
# stderr.
kiln_readme_install() {
  local dir=$1/readme
  shift
  mkdir -p "$dir"
  ln -sfn "$REPO/scripts" "$dir/scripts"
  ln -sfn "$REPO/charts" "$dir/charts"
  ln -sfn "$REPO/examples" "$dir/examples"
  kiln_readme_script "$@" >"$dir/install.sh" || return 1
  echo "   README.md's block, as run ($dir/install.sh):" >&2
  sed 's/^/   | /' "$dir/install.sh" >&2
  (cd "$dir" && bash -euo pipefail ./install.sh >&2)
}
