#!/usr/bin/env bash
# Benchmark (not a test): every model of the corpus (scripts/ensure/models.sh,
# node-agent/tests/data/corpus/README.md) on every candidate backend, through `kiln-agent local`
# (the path of a compile Job plus a node). The fixture is made once per model by ONNX Runtime
# from the script's inputs; every run compiles into a fresh store (no cache hit) and warms
# ITERATIONS times.
#
# Per model, one run of each backend first (tract, onnxruntime, iree), which says whether it is
# ready and how large its artifact is (a backend that is not prints its reason: a row of the
# table, not the end of the benchmark). Where ONNX Runtime and another are, the two then run
# interleaved through the shared harness (scripts/bench/harness.py) for ROUNDS rounds, tract
# against ONNX Runtime and IREE against ONNX Runtime: compile time and the warmup's p50 and
# p99, each side's median and min-max, the side's ratio of the medians with the range of the
# per-round ratios (>1: it is better than ONNX Runtime) and a verdict against 1.00x only where
# that range allows one. Then `auto` runs once and says which engine it chose, beside what the harness
# measured: its pick agrees when it chose the side the verdict favours, and either pick is
# fine when the verdict is inconclusive. ONNX Runtime's run uses every core, so the load gate
# counts every core as busy: it refuses (exit 3) a machine whose 1-minute load is above 0.25
# unless KILN_BENCH_FORCE_NOISY=1, which marks every line NOISY.
#
#   scripts/bench/corpus.sh [ITERATIONS] [MODEL...]   # defaults 50, every model
#
# Environment: KILN_BENCH_ROUNDS (3), KILN_BENCH_FORCE_NOISY, KILN_BENCH_OUT (a directory kept
# for MODEL.json, the harness's record, and rows.md). Uses target/release/kiln-agent when built
# (under $CARGO_TARGET_DIR when set), else debug; the ONNX Runtime library from
# scripts/ensure-onnxruntime.sh; IREE's compiler from scripts/ensure/iree.sh.
set -euo pipefail
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ITER=${1:-50}
shift || true
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
ROUNDS=${KILN_BENCH_ROUNDS:-3}
HARNESS=$REPO/scripts/bench/harness.py
ROUND=$REPO/scripts/bench/local-round.sh
# shellcheck source=SCRIPTDIR/prepare.sh
. "$REPO/scripts/bench/prepare.sh"
GATE=(--uses-cores "$(nproc)" --load-before "$LOAD_BEFORE")
[[ ${KILN_BENCH_FORCE_NOISY:-0} != 1 ]] || GATE+=(--force-noisy)
python3 "$HARNESS" --check-load "${GATE[@]}"
MODELS=("$@")
if ((${#MODELS[@]} == 0)); then
  MODELS=(pplcnet-orient ppocr-det ppocr-rec picodet-layout minilm-l6 magika silero-vad)
fi
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
KILN_IREE_BIN=$("$REPO/scripts/ensure/iree.sh")
export KILN_IREE_BIN
CORPUS=$("$REPO/scripts/ensure/models.sh")
WORK=$(mktemp -d /tmp/kiln-bench-corpus.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=${KILN_BENCH_OUT:-$WORK}
mkdir -p "$OUT"
: >"$OUT/rows.md"

# once MODEL BACKEND: one fresh run; its outcome in WORK/MODEL/BACKEND.json, a line out; status 1
# when it is not ready.
once() {
  local d=$WORK/$1 size
  if "$ROUND" --fresh --keep "$d/$2.json" "$AGENT" "$d/store-$2" "$d/$2.yaml" >/dev/null 2>"$d/$2.err"; then
    size=$(stat -c %s "$d/store-$2/artifacts/$(jq -r .compileKey "$d/$2.json")/artifact")
    jq -r --arg b "$2" --argjson size "$size" '"  \($b): ready\(if $b == "auto" then " on \(.engine)" else "" end), one run: compile \(.compileSeconds * 1000 | round) ms, p50 \(.p50Seconds * 1e6 | round / 1000) ms, parity \(.parityMaxAbsError), artifact \($size / 1e5 | round / 10) MB"' "$d/$2.json"
  else
    echo "  $2: $(head -1 "$d/$2.err" | cut -c1-200)"
    return 1
  fi
}

# auto_agrees MODEL: auto's pick beside the harness's p50 verdict for MODEL.
auto_agrees() {
  local d=$WORK/$1 engine kind
  engine=$(jq -r .engine "$d/auto.json")
  kind=$(jq -r '.figures[] | select(.name == "p50 s") | .verdict_kind' "$OUT/$1-tract.json")
  case $kind/$engine in
    */iree) echo "  auto chose iree: see the iree rows" ;;
    met/tract* | below/onnxruntime*) echo "  auto chose $engine: the side the p50 verdict favours" ;;
    inconclusive/* | no-verdict/*) echo "  auto chose $engine: the p50 verdict is $kind, either pick is fine" ;;
    *) echo "  auto chose $engine, AGAINST the p50 verdict ($kind for tract); its own measurement differed" ;;
  esac
}

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); ONNX Runtime: $ORT_DYLIB_PATH; $ITER warmup iterations; $ROUNDS rounds"
# compare MODEL SIDE: SIDE (tract or iree) against ONNX Runtime through the harness.
compare() {
  local m=$1 side=$2
  python3 "$HARNESS" --name "$m ($side)" --a-label "$side" --bound onnxruntime --goal 1.0 --rounds "$ROUNDS" \
    "${GATE[@]}" --json "$OUT/$m-$side.json" --markdown="$OUT/rows.md" \
    --a "$(argv_json "$ROUND" --fresh "$AGENT" "$WORK/$m/store-$side" "$WORK/$m/$side.yaml")" \
    --b "$(argv_json "$ROUND" --fresh "$AGENT" "$WORK/$m/store-onnxruntime" "$WORK/$m/onnxruntime.yaml")" \
    --figure 'compile s:lower' --a-get json:compileSeconds --b-get json:compileSeconds \
    --figure 'p50 s:lower' --a-get json:p50Seconds --b-get json:p50Seconds \
    --figure 'p99 s:lower' --a-get json:p99Seconds --b-get json:p99Seconds | sed 's/^/  /'
}

for m in "${MODELS[@]}"; do
  echo "== $m"
  prepare "$m" tract onnxruntime iree auto
  declare -A ready=()
  for backend in tract onnxruntime iree; do once "$m" "$backend" && ready[$backend]=1; done
  for side in tract iree; do
    if [[ -n ${ready[onnxruntime]:-} && -n ${ready[$side]:-} ]]; then
      compare "$m" "$side"
    else
      echo "| $m ($side) | $side or onnxruntime is not ready: no comparison (above) | | | | | |" >>"$OUT/rows.md"
    fi
  done
  if once "$m" auto && [[ -n ${ready[tract]:-} && -n ${ready[onnxruntime]:-} ]]; then auto_agrees "$m"; fi
  unset ready
done
echo
echo "| model (side) and figure | side median (min–max) | onnxruntime median (min–max) | ratio (range) | rounds | load before→after | verdict |"
echo "|---|---|---|---|---|---|---|"
cat "$OUT/rows.md"
