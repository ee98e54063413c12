#!/usr/bin/env bash
# Benchmark (not a test): what running engines in their own process (engines/src/pipeline/isolate/)
# costs and what it bounds, both ways in the same run.
#
# 1. Prepare time on real models (scripts/ensure/models.sh) with backend onnxruntime: after one
#    compile into the store, `kiln-agent local` runs (store hit: verified pull, load, warmup with
#    ITERATIONS fixture runs) with the engine in a child (the product) and in process
#    (--engine-in-process, the old path), interleaved through the shared harness
#    (scripts/bench/harness.py) for ROUNDS rounds after a discarded warmup pair: per figure each
#    side's median and min-max, the ratio of the medians with the range of the per-round ratios
#    (>1: the child is better) and a verdict against GOAL (KILN_BENCH_GOAL, 0.9: the child costs
#    at most about a ninth more) only where that range allows one. Figures: the wall time of the
#    whole run, the load time, and the engine's peak resident memory above its process's
#    baseline. ONNX Runtime's run uses every core, so the load gate counts every core as busy:
#    it refuses (exit 3) a machine whose 1-minute load is above 0.25 unless
#    KILN_BENCH_FORCE_NOISY=1, which marks every line NOISY.
# 2. The 212-byte model (tests/data/huge.onnx) with its constant at 4 GiB, which ONNX Runtime
#    allocates itself: peak resident set of kiln-agent and its children (getrusage
#    RUSAGE_CHILDREN of a fresh Python per run) with --memory-limit 2Gi, in process and in the
#    child, once each: what the child bounds, not a speed.
#
#   scripts/bench/isolation.sh [ROUNDS] [ITERATIONS] [MODEL...]  # defaults 5, 20, three models
#
# Uses target/release/kiln-agent when built, else debug; needs jq and python3. KILN_BENCH_OUT
# keeps the harness's records (MODEL.json) and rows.md in that directory.
set -euo pipefail
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ROUNDS=${1:-5}
ITER=${2:-20}
shift 2 || shift $# || true
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
HARNESS=$REPO/scripts/bench/harness.py
ROUND=$REPO/scripts/bench/local-round.sh
# shellcheck source=SCRIPTDIR/prepare.sh
. "$REPO/scripts/bench/prepare.sh"
GATE=(--uses-cores "$(nproc)" --load-before "$LOAD_BEFORE")
[[ ${KILN_BENCH_FORCE_NOISY:-0} != 1 ]] || GATE+=(--force-noisy)
python3 "$HARNESS" --check-load "${GATE[@]}"
MODELS=("$@")
if ((${#MODELS[@]} == 0)); then
  MODELS=(pplcnet-orient ppocr-det minilm-l6)
fi
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
CORPUS=$("$REPO/scripts/ensure/models.sh")
WORK=$(mktemp -d /tmp/kiln-bench-isolation.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=${KILN_BENCH_OUT:-$WORK}
mkdir -p "$OUT"
: >"$OUT/rows.md"

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

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); $ROUNDS rounds, $ITER warmup iterations"
for m in "${MODELS[@]}"; do
  d=$WORK/$m
  prepare "$m" onnxruntime
  mv "$d/onnxruntime.yaml" "$d/kiln.yaml"
  "$AGENT" local --output json --store "$d/store" "$d/kiln.yaml" >/dev/null 2>&1 || true
  python3 "$HARNESS" --name "$m" --a-label child --bound in-process --goal "${KILN_BENCH_GOAL:-0.9}" \
    --rounds "$ROUNDS" --warmup "${GATE[@]}" --json "$OUT/$m.json" --markdown="$OUT/rows.md" \
    --a "$(argv_json "$ROUND" "$AGENT" "$d/store" "$d/kiln.yaml")" \
    --b "$(argv_json "$ROUND" "$AGENT" "$d/store" "$d/kiln.yaml" --engine-in-process)" \
    --figure 'wall s:lower' --a-get wall --b-get wall \
    --figure 'load s:lower' --a-get json:loadSeconds --b-get json:loadSeconds \
    --figure 'engine peak memory bytes:lower' --a-get json:peakMemoryBytes --b-get json:peakMemoryBytes
done
echo
echo "| model and figure | child median (min–max) | in-process median (min–max) | ratio (range) | rounds | load before→after | verdict |"
echo "|---|---|---|---|---|---|---|"
cat "$OUT/rows.md"

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
