#!/usr/bin/env bash
# Benchmark (not a test): tract, then IREE, against ONNX Runtime on the same model and machine,
# through `kiln-agent local` (the path of a compile Job plus a node), through the shared harness
# (scripts/bench/harness.py): the side and ONNX Runtime run interleaved (side, ONNX Runtime,
# side, ...) for ROUNDS rounds after one discarded warmup pair, each round compiling into a
# fresh store (no cache hit) and warming ITERATIONS times. Per figure, each side's median and
# min-max, the side's ratio of the medians with the range of the per-round ratios (>1: the side is
# better), and a verdict against 1.00x only where that range allows one: compile time, load
# time, the steady p50 and p99 of the warmup, the first run after Ready as a multiple of that
# p50, and peak memory of load and warmup. Then the README rows.
#
# Model: the example SqueezeNet (batch 1), the one real model both backends compile here (the
# tests' MLP is ONNX IR version 14, which ONNX Runtime 1.31 refuses: it reads up to 13).
# ONNX Runtime's run uses every core, so the load gate counts every core as busy: on a machine
# whose 1-minute load is above 0.25 it refuses (exit 3) unless KILN_BENCH_FORCE_NOISY=1, which
# marks every line NOISY.
#
#   scripts/bench/backends.sh [ITERATIONS] [ROUNDS]   # defaults 200 5
#
# Uses target/release/kiln-agent when built (cargo build --release -p kiln-agent; under
# $CARGO_TARGET_DIR when set), else debug; the ONNX Runtime library from
# scripts/ensure-onnxruntime.sh, IREE's compiler from scripts/ensure/iree.sh. KILN_BENCH_OUT
# keeps the harness's records (squeezenet-SIDE.json) and rows.md in that directory.
set -euo pipefail
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ITER=${1:-200}
ROUNDS=${2:-5}
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
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
KILN_IREE_BIN=$("$REPO/scripts/ensure/iree.sh")
export ORT_DYLIB_PATH KILN_IREE_BIN
WORK=$(mktemp -d /tmp/kiln-bench-backends.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=${KILN_BENCH_OUT:-$WORK}
mkdir -p "$OUT"
: >"$OUT/rows.md"

d=$WORK/squeezenet
prepare_example tract onnxruntime iree
# side BACKEND: the harness's command for BACKEND's side, compiling afresh each round.
side() { argv_json "$ROUND" --fresh "$AGENT" "$d/store-$1" "$d/$1.yaml"; }

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); ONNX Runtime: $ORT_DYLIB_PATH; $ITER warmup iterations"
for a in tract iree; do
  echo "== $a against onnxruntime"
  python3 "$HARNESS" --name "squeezenet ($a)" --a-label "$a" --bound onnxruntime --goal 1.0 \
    --rounds "$ROUNDS" --warmup "${GATE[@]}" --json "$OUT/squeezenet-$a.json" --markdown="$OUT/rows.md" \
    --a "$(side "$a")" --b "$(side onnxruntime)" \
    --figure 'compile s:lower' --a-get json:compileSeconds --b-get json:compileSeconds \
    --figure 'load s:lower' --a-get json:loadSeconds --b-get json:loadSeconds \
    --figure 'p50 s:lower' --a-get json:p50Seconds --b-get json:p50Seconds \
    --figure 'p99 s:lower' --a-get json:p99Seconds --b-get json:p99Seconds \
    --figure 'first after Ready / p50:lower' --a-get json:firstRequestSeconds/p50Seconds \
    --b-get json:firstRequestSeconds/p50Seconds \
    --figure 'peak memory bytes:lower' --a-get json:peakMemoryBytes --b-get json:peakMemoryBytes
done
echo
echo "| model (side) and figure | side median (min–max) | onnxruntime median (min–max) | ratio (range) | rounds | load before→after | verdict |"
echo "|---|---|---|---|---|---|---|"
cat "$OUT/rows.md"
