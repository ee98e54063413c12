#!/usr/bin/env bash
# Benchmark (not a test): tract against ONNX Runtime on the same models and machine, through
# `kiln-agent local` (the same path as a compile Job plus a node): compile time, load time, the
# first (cold) fixture run and the steady p50/p99 of the warmup, the first run after Ready as a
# multiple of that p50 (ready_1st), peak memory of load and warmup,
# printed side by side with the ONNX Runtime / tract ratio. Each backend compiles into a fresh
# store (no cache hit), then warms ITERATIONS times.
#
# Model: the example SqueezeNet (batch 1), the one real model both backends compile here (the
# tests' MLP is ONNX IR version 14, which ONNX Runtime 1.31 refuses: it reads up to 13). ROUNDS
# repeats the pair to show the spread.
#
#   scripts/bench/backends.sh [ITERATIONS] [ROUNDS]   # defaults 200 3
#
# Uses target/release/kiln-agent when built (cargo build --release -p kiln-agent; under
# $CARGO_TARGET_DIR when set), else debug; the ONNX Runtime library from
# scripts/ensure-onnxruntime.sh.
set -euo pipefail
ITER=${1:-200}
ROUNDS=${2:-3}
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
WORK=$(mktemp -d /tmp/kiln-bench-backends.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# squeezenet DIR: the example SqueezeNet in DIR.
squeezenet() {
  mkdir -p "$1"
  cp "$REPO/examples/squeezenet/"{model.onnx,fixture-v1.safetensors,kiln.yaml} "$1/"
}

# run DIR BACKEND: one local run of DIR/kiln.yaml with the backend and ITER iterations; prints
# the JSON outcome.
run() {
  local dir=$1 backend=$2
  sed -e "s/kind: tract/kind: $backend/" -e "s/iterations: [0-9]*/iterations: $ITER/" "$dir/kiln.yaml" >"$dir/$backend.yaml"
  "$AGENT" local --output json --store "$dir/store-$backend" "$dir/$backend.yaml" 2>/dev/null | tail -1
}

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); ONNX Runtime: $ORT_DYLIB_PATH; $(nproc) CPUs; $ITER warmup iterations"
printf '%-11s %-12s %10s %9s %9s %9s %9s %9s %9s %8s\n' model backend compile_ms load_ms first_ms p50_ms p99_ms ready_1st peak_MB nodes
for ((round = 1; round <= ROUNDS; round++)); do
  model=squeezenet
  rm -rf "${WORK:?}/$model"
  "$model" "$WORK/$model"
  declare -A R=()
  for backend in tract onnxruntime; do
    out=$(run "$WORK/$model" "$backend")
    jq -e .ready <<<"$out" >/dev/null || { echo "$model on $backend not ready: $(jq -r .message <<<"$out")" >&2; exit 1; }
    R[$backend]=$out
    jq -r --arg m "$model" --arg b "$backend" '[$m, $b,
      (.compileSeconds * 1000), (.loadSeconds * 1000), (.firstSeconds * 1000), (.p50Seconds * 1000), (.p99Seconds * 1000),
      (.firstRequestSeconds / .p50Seconds),
      ((.peakMemoryBytes // 0) / 1048576), (.placement.nodes | to_entries | map("\(.key):\(.value)") | join(","))] |
      "\(.[0]) \(.[1]) \(.[2]) \(.[3]) \(.[4]) \(.[5]) \(.[6]) \(.[7]) \(.[8]) \(.[9])"' <<<"$out" |
      while read -r m b c l f p50 p99 after peak nodes; do
        printf '%-11s %-12s %10.1f %9.2f %9.3f %9.3f %9.3f %8.2fx %9.1f %8s\n' "$m" "$b" "$c" "$l" "$f" "$p50" "$p99" "$after" "$peak" "$nodes"
      done
  done
  jq -rn --argjson t "${R[tract]}" --argjson o "${R[onnxruntime]}" '
    def r(k): if ($t[k] // 0) > 0 then ($o[k] / $t[k] * 100 | round / 100 | tostring) + "x" else "-" end;
    "\("") onnxruntime/tract compile \(r("compileSeconds")), load \(r("loadSeconds")), first \(r("firstSeconds")), p50 \(r("p50Seconds")), p99 \(r("p99Seconds"))"' |
    sed "s/^/$model /"
done
