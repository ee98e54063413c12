#!/usr/bin/env bash
# Benchmark (not a test): what running engines in their own process (engines/src/pipeline/isolate/)
# costs and what it bounds, both ways in the same run.
#
# 1. Prepare time on real models (scripts/ensure/models.sh) with backend onnxruntime: after one
#    compile into the store, ROUNDS alternating `kiln-agent local` runs (store hit: verified pull,
#    load, warmup with ITERATIONS fixture runs) with the engine in a child (the product) and in
#    process (--engine-in-process, the old path): median wall time of the whole run, median load
#    time, the engine's peak resident memory above its process's baseline, and child/in-process.
# 2. The 212-byte model (tests/data/huge.onnx) with its constant at 4 GiB, which ONNX Runtime
#    allocates itself: peak resident set of kiln-agent and its children (getrusage
#    RUSAGE_CHILDREN) with --memory-limit 2Gi, in process and in the child.
#
#   scripts/bench/isolation.sh [ROUNDS] [ITERATIONS] [MODEL...]  # defaults 5, 20, three models
#
# Uses target/release/kiln-agent when built, else debug; needs jq and python3.
set -euo pipefail
ROUNDS=${1:-5}
ITER=${2:-20}
shift 2 || shift $# || true
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
MODELS=("$@")
if ((${#MODELS[@]} == 0)); then
  MODELS=(pplcnet-orient ppocr-det minilm-l6)
fi
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
CORPUS=$("$REPO/scripts/ensure/models.sh")
WORK=$(mktemp -d /tmp/kiln-bench-isolation.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# timed ARGS...: runs kiln-agent; prints "wall_seconds maxrss_bytes" then its last stdout line.
timed() {
  python3 - "$AGENT" "$@" <<'PY'
import resource, subprocess, sys, time
t = time.monotonic()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
wall = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(f"{wall:.4f} {rss}")
print((p.stdout.strip().splitlines() or ["{}"])[-1])
PY
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); $(nproc) CPUs; $ROUNDS rounds, $ITER warmup iterations"
printf '%-15s %-10s %9s %9s %10s %8s\n' model mode wall_ms load_ms peak_mb ready
declare -A WALL
for m in "${MODELS[@]}"; do
  d=$WORK/$m
  mkdir -p "$d"
  cp "$CORPUS/$m.onnx" "$d/"
  "$AGENT" fixtures --reference onnxruntime --fixture-version v1 --model "$d/$m.onnx" \
    --inputs "$CORPUS/$m-inputs.safetensors" --out "$d/$m-fixture-v1.safetensors" >"$d/fixtures.log" 2>&1 ||
    { cat "$d/fixtures.log" >&2; exit 1; }
  digest=$(sha256_of "$d/$m-fixture-v1.safetensors")
  sed -e "s/@FIXTURE_SHA256@/$digest/" -e "s/kind: tract/kind: onnxruntime/" \
    -e "s/iterations: [0-9]*/iterations: $ITER/" "$REPO/node-agent/tests/data/corpus/$m.yaml" >"$d/kiln.yaml"
  "$AGENT" local --output json --store "$d/store" "$d/kiln.yaml" >/dev/null 2>&1 || true
  for mode in child in-process; do : >"$d/$mode.tsv"; done
  for ((r = 0; r < ROUNDS; r++)); do
    for mode in child in-process; do
      flag=()
      [[ $mode == in-process ]] && flag=(--engine-in-process)
      out=$(timed "${flag[@]}" local --output json --store "$d/store" "$d/kiln.yaml")
      wall=$(head -1 <<<"$out" | cut -d' ' -f1)
      tail -1 <<<"$out" | jq -r --arg w "$wall" '[$w, (.loadSeconds // 0), (.peakMemoryBytes // 0), .ready] | @tsv' >>"$d/$mode.tsv"
    done
  done
  for mode in child in-process; do
    w=$(cut -f1 "$d/$mode.tsv" | median)
    l=$(cut -f2 "$d/$mode.tsv" | median)
    p=$(cut -f3 "$d/$mode.tsv" | median)
    ready=$(cut -f4 "$d/$mode.tsv" | sort -u | tr '\n' ' ')
    WALL[$m/$mode]=$w
    printf '%-15s %-10s %9.1f %9.2f %10.1f %8s\n' "$m" "$mode" "$(bc -l <<<"$w*1000")" "$(bc -l <<<"$l*1000")" "$(bc -l <<<"$p/1000000")" "$ready"
  done
  printf '%-15s %-10s %9.2fx\n' "$m" ratio "$(bc -l <<<"${WALL[$m/child]}/${WALL[$m/in-process]}")"
done

echo
echo "212-byte model, constant of 4 GiB, --memory-limit 2Gi (peak RSS of kiln-agent and its children):"
h=$WORK/huge
mkdir -p "$h"
python3 - "$REPO/node-agent/tests/data/huge.onnx" "$h/model.onnx" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
old = struct.pack("<qq", 100000, 100000)
assert b.count(old) == 1
open(sys.argv[2], "wb").write(b.replace(old, struct.pack("<qq", 1024, 1 << 20)))
PY
"$AGENT" fixtures --memory-limit 8Gi --fixture-version v1 --shape x=4,16 --model "$h/model.onnx" \
  --out "$h/fixture.safetensors" >"$h/fixtures.log" 2>&1 || { cat "$h/fixtures.log" >&2; exit 1; }
cat >"$h/kiln.yaml" <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: huge}
spec:
  source: {uri: "file://model.onnx", sha256: "$(sha256_of "$h/model.onnx")", size: $(stat -c %s "$h/model.onnx")}
  format: onnx
  inputs:
    - {name: x, dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 16}]}
  fixtures:
    - {version: v1, uri: "file://fixture.safetensors", sha256: "$(sha256_of "$h/fixture.safetensors")"}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: huge-ort}
spec:
  modelRef: {name: huge}
  backend: {kind: onnxruntime}
  profiles: [{name: p, dims: {batch: 4}}]
  warmup: {iterations: 1, fixtureVersion: v1}
YAML
for mode in in-process child; do
  flag=()
  [[ $mode == in-process ]] && flag=(--engine-in-process)
  rm -rf "$h/store"
  out=$(timed "${flag[@]}" --memory-limit 2Gi local --output json --store "$h/store" "$h/kiln.yaml")
  read -r wall rss < <(head -1 <<<"$out")
  printf '  %-10s peak RSS %8.1f MB in %6.2f s: %s\n' "$mode" "$(bc -l <<<"$rss/1000000")" "$wall" \
    "$(tail -1 <<<"$out" | jq -r 'if .ready then "ready" else "\(.reason): \(.message | .[0:160])" end')"
done
