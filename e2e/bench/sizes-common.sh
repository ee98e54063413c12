# shellcheck shell=bash
# The set-up e2e/bench/sizes.sh and e2e/bench/sizes-faults.sh share: the generated GGUF models and
# their fixtures (cached), kiln installed by its chart for one size and variant, the
# ModelArtifact + CompiledTarget and the llama-server Deployment written out, the images, and the
# teardown. Source after e2e/tests/lib.sh and kiln-lib.sh, with OUT (the results directory) set;
# the sourcing script defines `die` (which may call kiln_diagnose "$NS" "$REAL").
#
#   ensure_model SIZE TYPE     prints the cached model's path, generating it (and its fixture) once
#   sizes_images DIR           kiln's images and llama-server's (LLAMA_IMAGE) built and loaded
#   variant_setup SIZE VARIANT kiln up for one variant; sets (the caller may declare them local):
#                              src quant atol model fix len D NS REL REPOSITORY TARGET WORK size_b
#                              sha_src; writes $D/objects.yaml and $D/serving.yaml
#   teardown_variant           everything variant_setup made, gone (stop_host_server first, when
#                              the sourcing script defines it)
BENCH=${BENCH:-$REPO/e2e/bench}
CACHE=${KILN_BENCH_CACHE:-/var/cache/kiln/sizes}
SEED=${KILN_BENCH_SEED:-1}
MAX_DISK=${KILN_BENCH_MAX_DISK_PCT:-70}
NETNS=kiln-e2e
LLAMA_SERVER=$("$REPO/scripts/ensure/llama-tools.sh" --cached llama-server) ||
  { echo "llama-server is not built: scripts/ensure/llama-tools.sh llama-server builds it once" >&2; exit 1; }
LLAMA_IMAGE=e2e/llama-server:b11434
REAL=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
NS= REL= WORK=
say() { echo "$*" >&2; }
disk_pct() { df --output=pcent / | tail -1 | tr -dc '0-9'; }
disk_ok() {
  local p
  p=$(disk_pct)
  ((p < MAX_DISK)) || die "/ is ${p}% used (limit ${MAX_DISK}%): $(df -h / | tail -1)"
}
now() { date +%s.%N; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# ensure_model SIZE TYPE: prints the cached model's path, generating it (and its fixture,
# MODEL.fixture-v1.safetensors) once.
ensure_model() {
  local m=$CACHE/llama-${1}gb-$2-s$SEED.gguf
  if [[ ! -f $m ]]; then
    disk_ok
    say "   generating $m"
    python3 "$REPO/scripts/gen/llama-gguf.py" --size-gb "$1" --type "$2" --seed "$SEED" --out "$m" >&2 ||
      die "scripts/gen/llama-gguf.py failed"
  fi
  if [[ ! -f $m.fixture-v1.safetensors ]]; then
    cat >"$CACHE/chat.json" <<'JSON'
[{"role": "system", "content": "You answer in one short sentence."},
 {"role": "user", "content": "What does a kiln do?"}]
JSON
    say "   making its fixture"
    "$(bin kiln-agent)" fixtures --reference llamacpp --fixture-version v1 --chat "$CACHE/chat.json" \
      --generate 8 --model "$m" --out "$m.fixture-v1.safetensors.tmp" >/dev/null 2>"$OUT/fixtures.log" ||
      die "kiln-agent fixtures: $(tail -5 "$OUT/fixtures.log")"
    mv "$m.fixture-v1.safetensors.tmp" "$m.fixture-v1.safetensors"
  fi
  chmod 644 "$m" "$m.fixture-v1.safetensors"
  echo "$m"
}

# sizes_images DIR: kiln's images (from $(bin kiln-agent)'s directory) and llama-server's
# ($LLAMA_IMAGE), built in DIR and loaded into the node; DIR removed after.
sizes_images() {
  echo "== images (kiln's from $(dirname "$(bin kiln-agent)"), llama-server's)"
  kiln_images "$1" || die "images"
  "$E2E_DIR/build-image" --name "$LLAMA_IMAGE" --out "$1/llama-server.tar" "$LLAMA_SERVER" >/dev/null ||
    die "llama-server image"
  "$E2E_DIR/cluster" load-image "$1/llama-server.tar" >/dev/null || die "load llama-server image"
  rm -rf "$1"
}

# variant_setup SIZE VARIANT: the variant's model (generated once), a namespace, release and
# registry repository of its own, kiln installed with the sources and node cache under WORK, the
# KilnNode reporting llamacpp; $D/objects.yaml (the ModelArtifact and the CompiledTarget:
# contextLength 128, 3 warmup iterations, the 8 greedy tokens exact) and $D/serving.yaml (the
# README's llama-server Deployment and Service) written, not applied.
variant_setup() {
  local size=$1 variant=$2
  case $variant in
    f16-q8_0) src=f16 quant=Q8_0 atol=2 ;;
    f16-q4_k_m) src=f16 quant=Q4_K_M atol=6 ;;
    q4_0) src=q4_0 quant= atol=1.0e-3 ;;
    *) die "unknown variant $variant (f16-q8_0, f16-q4_k_m, q4_0)" ;;
  esac
  echo "== $size GB, $variant (load before: $(cut -d' ' -f1-3 /proc/loadavg); disk: $(df -h / | awk 'NR==2 {print $3 " used, " $5}'))"
  model=$(ensure_model "$size" "$src")
  fix=$model.fixture-v1.safetensors
  len=$(python3 -c 'import json,struct,sys; r=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",r[:8])[0]
print(json.loads(r[8:8+n])["input/prompt"]["shape"][0])' "$fix")
  disk_ok
  D=$OUT/$size-$variant
  mkdir -p "$D"
  NS=sizes-$(tr -c 'a-z0-9\n' '-' <<<"$size-$variant" | tr -s '-')-$RANDOM
  REL=$NS REPOSITORY=kiln-e2e/$NS TARGET=llama
  WORK=$(mktemp -d /var/tmp/kiln-bench-sizes.XXXXXX)
  chmod 755 "$WORK"
  install -d -m 755 "$WORK/sources" "$WORK/cache"
  ln "$model" "$WORK/sources/model.gguf" 2>/dev/null || cp "$model" "$WORK/sources/model.gguf"
  cp "$fix" "$WORK/sources/fixture-v1.safetensors"
  chmod 644 "$WORK/sources/"*
  kubectl create namespace "$NS" >/dev/null
  kiln_fresh_crds
  local helm=()
  # shellcheck disable=SC2206
  [[ -z ${KILN_BENCH_HELM_ARGS:-} ]] || helm=($KILN_BENCH_HELM_ARGS)
  # From 2 GB up the agent's and the compile Job's memory limits follow the model: the chart's
  # 4Gi agent and the compile Job's default 4Gi cannot hold a 4 GB engine (the compile refuses
  # it as IncompatibleHardware, saying how much it needs).
  local compile_spec=
  if (($(echo "$size >= 2" | bc))); then
    local gi
    gi=$(echo "($size * 3 + 1) / 1" | bc)
    helm=(--set "agent.resources.limits.memory=${gi}Gi" "${helm[@]}")
    compile_spec="  compile: {resources: {limits: {memory: ${gi}Gi}}}"
  fi
  kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" "${helm[@]}" || die "kiln did not come up"
  wait_for "KilnNode $REAL reports llamacpp" 120 \
    bash -c "kubectl get kilnnode $REAL -o json | jq -e '.status.hardware.runtimes.llamacpp'"

  size_b=$(stat -c %s "$WORK/sources/model.gguf")
  sha_src=$(sha256sum "$WORK/sources/model.gguf" | cut -d' ' -f1)
  cat >"$D/objects.yaml" <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: $TARGET}
spec:
  source: {uri: "file://model.gguf", sha256: "$sha_src", size: $size_b}
  format: gguf
  inputs:
    - {name: prompt, dtype: i32, dims: [{symbol: len, min: 1, max: 120}]}
    - {name: generate, dtype: i32, dims: [{size: 1}]}
  fixtures:
    - {version: v1, uri: "file://fixture-v1.safetensors", sha256: "$(sha256sum "$fix" | cut -d' ' -f1)"}
  license: Apache-2.0
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $TARGET}
spec:
  modelRef: {name: $TARGET}
  backend: {kind: llamacpp, llamacpp: {contextLength: 128${quant:+, quantization: $quant}}}
  profiles: [{name: chat, dims: {len: $len}}]
${compile_spec}
  warmup:
    iterations: 3
    fixtureVersion: v1
    outputs:
      - {name: logits, atol: $atol, rtol: 1.0e-3}
      - {name: tokens, atol: 0, rtol: 0}
YAML
  sed -e "s|IMAGE|$LLAMA_IMAGE|" -e "s|NAMESPACE|$NS|" -e "s|TARGET|$TARGET|g" "$REPO/examples/serving/llama-server.yaml" |
    sed 's|^          args: \[-m|          imagePullPolicy: Never\n          args: [-m|' >"$D/serving.yaml"
}

teardown_variant() {
  if declare -F stop_host_server >/dev/null; then stop_host_server; fi
  [[ -n $NS ]] || return 0
  kubectl -n "$NS" delete deploy --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  for _ in $(seq 120); do
    [[ -z $(kubectl -n "$NS" get pods -l "app=$TARGET" -o name 2>/dev/null) ]] && break
    sleep 0.5
  done
  kubectl -n "$NS" delete compiledtarget --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  helm uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  # The registry's copy of this variant: its repository and the blobs it links (only its own).
  local repo=$REGISTRY_DIR/docker/registry/v2/repositories/$REPOSITORY hex
  if [[ -d $repo/_layers/sha256 ]]; then
    for hex in "$repo"/_layers/sha256/*; do
      hex=${hex##*/}
      [[ $hex != '*' ]] || continue
      rm -rf "$REGISTRY_DIR/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex"
    done
  fi
  rm -rf "$repo"
  if [[ -n $WORK && -d $WORK ]]; then
    findmnt -rn -o TARGET | grep "^$WORK/" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$WORK"
  fi
  NS= WORK=
}
