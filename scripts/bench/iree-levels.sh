#!/usr/bin/env bash
# Benchmark (not a test): what IREE's code per class is worth. The same model compiled by the
# `iree` backend for an x86-64-v3 class and for this machine's x86-64-v4 class (`kiln-agent
# local --cpu-level`), both run here, through the shared harness (scripts/bench/harness.py):
# v4 against v3 (>1: the v4 class's own code is faster), then v4 against ONNX Runtime on the
# same model (>1: IREE is faster), each interleaved for ROUNDS rounds after a discarded warmup
# pair, each round compiling into a fresh store. Figures: the warmup's p50 and p99, and compile
# time. Models: the example SqueezeNet, and the corpus models given (default minilm-l6).
# Needs an x86-64-v4 CPU (exit 3 otherwise). ONNX Runtime and IREE's task executor use every
# core, so the load gate counts every core as busy (exit 3 above 0.25 of load unless
# KILN_BENCH_FORCE_NOISY=1, which marks every line NOISY).
#
#   scripts/bench/iree-levels.sh [ITERATIONS] [ROUNDS] [MODEL...]   # defaults 100 5 minilm-l6
#
# Uses target/release/kiln-agent when built (under $CARGO_TARGET_DIR when set), else debug;
# ONNX Runtime from scripts/ensure-onnxruntime.sh, IREE's compiler from scripts/ensure/iree.sh.
# KILN_BENCH_OUT keeps the harness's records and rows.md in that directory.
set -euo pipefail
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ITER=${1:-100}
ROUNDS=${2:-5}
shift 2 || shift $#
MODELS=("$@")
((${#MODELS[@]})) || MODELS=(minilm-l6)
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
HARNESS=$REPO/scripts/bench/harness.py
ROUND=$REPO/scripts/bench/local-round.sh
# shellcheck source=SCRIPTDIR/prepare.sh
. "$REPO/scripts/bench/prepare.sh"
grep -qw avx512f /proc/cpuinfo || { echo "iree-levels: this CPU is not x86-64-v4; nothing to compare" >&2; exit 3; }
GATE=(--uses-cores "$(nproc)" --load-before "$LOAD_BEFORE")
[[ ${KILN_BENCH_FORCE_NOISY:-0} != 1 ]] || GATE+=(--force-noisy)
python3 "$HARNESS" --check-load "${GATE[@]}"
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
KILN_IREE_BIN=$("$REPO/scripts/ensure/iree.sh")
export ORT_DYLIB_PATH KILN_IREE_BIN
CORPUS=$("$REPO/scripts/ensure/models.sh")
WORK=$(mktemp -d /tmp/kiln-bench-iree-levels.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=${KILN_BENCH_OUT:-$WORK}
mkdir -p "$OUT"
: >"$OUT/rows.md"

prepare_example iree onnxruntime
for m in "${MODELS[@]}"; do prepare "$m" iree onnxruntime; done

# side MODEL BACKEND [LEVEL]: the harness's command for one side, as a node of LEVEL would run it.
side() {
  local level=${3:-x86-64-v4}
  argv_json env KILN_LOCAL_CPU_LEVEL="$level" "$ROUND" --fresh "$AGENT" "$WORK/$1/store-$2-$level" "$WORK/$1/$2.yaml"
}
FIGURES=(--figure 'p50 s:lower' --a-get json:p50Seconds --b-get json:p50Seconds
  --figure 'p99 s:lower' --a-get json:p99Seconds --b-get json:p99Seconds
  --figure 'compile s:lower' --a-get json:compileSeconds --b-get json:compileSeconds)

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); $ITER warmup iterations; $ROUNDS rounds"
for m in squeezenet "${MODELS[@]}"; do
  echo "== $m: iree for x86-64-v4 (this class) against iree for x86-64-v3"
  python3 "$HARNESS" --name "$m (iree v4 / v3)" --a-label "iree v4" --bound "iree v3" --goal 1.0 \
    --rounds "$ROUNDS" --warmup "${GATE[@]}" --json "$OUT/$m-levels.json" --markdown="$OUT/rows.md" \
    --a "$(side "$m" iree x86-64-v4)" --b "$(side "$m" iree x86-64-v3)" "${FIGURES[@]}" | sed 's/^/  /'
  echo "== $m: iree for x86-64-v4 against ONNX Runtime"
  python3 "$HARNESS" --name "$m (iree v4 / onnxruntime)" --a-label "iree v4" --bound onnxruntime --goal 1.0 \
    --rounds "$ROUNDS" --warmup "${GATE[@]}" --json "$OUT/$m-ort.json" --markdown="$OUT/rows.md" \
    --a "$(side "$m" iree)" --b "$(side "$m" onnxruntime)" "${FIGURES[@]}" | sed 's/^/  /'
done
echo
echo "| model (A / B) and figure | A median (min–max) | B median (min–max) | ratio (range) | rounds | load before→after | verdict |"
echo "|---|---|---|---|---|---|---|"
cat "$OUT/rows.md"
