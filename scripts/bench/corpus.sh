#!/usr/bin/env bash
# Benchmark (not a test): every model of the corpus (scripts/ensure/models.sh,
# node-agent/tests/data/corpus/README.md) on every candidate backend, through `kiln-agent local`
# (the same path as a compile Job plus a node): compile time, load time, the first (cold) fixture
# run, the steady p50/p99 of the warmup, and each backend's p50 as a multiple of the fastest
# ready candidate's for that model (1.00x is the fastest). A backend that is not ready prints its
# reason instead. Each (model, backend) compiles into a fresh store (no cache hit), then warms
# ITERATIONS times; the fixture is made once per model by ONNX Runtime from the script's inputs.
#
#   scripts/bench/corpus.sh [ITERATIONS] [MODEL...]   # defaults 50, every model
#
# Uses target/release/kiln-agent when built (cargo build --release -p kiln-agent; under
# $CARGO_TARGET_DIR when set), else debug; the ONNX Runtime library from
# scripts/ensure-onnxruntime.sh.
set -euo pipefail
ITER=${1:-50}
shift || true
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
# The candidates, as in node-agent/tests/corpus.rs's BACKENDS.
BACKENDS=(tract onnxruntime auto)
MODELS=("$@")
if ((${#MODELS[@]} == 0)); then
  MODELS=(pplcnet-orient ppocr-det ppocr-rec picodet-layout minilm-l6 magika silero-vad)
fi
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
CORPUS=$("$REPO/scripts/ensure/models.sh")
WORK=$(mktemp -d /tmp/kiln-bench-corpus.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# prepare MODEL: WORK/MODEL with the model, its ONNX Runtime fixture and the spec's template.
prepare() {
  local m=$1 d=$WORK/$1
  mkdir -p "$d"
  cp "$CORPUS/$m.onnx" "$d/"
  "$AGENT" fixtures --reference onnxruntime --fixture-version v1 --model "$d/$m.onnx" \
    --inputs "$CORPUS/$m-inputs.safetensors" --out "$d/$m-fixture-v1.safetensors" >"$d/fixtures.log" 2>&1 ||
    { cat "$d/fixtures.log" >&2; exit 1; }
  local digest
  digest=$(sha256_of "$d/$m-fixture-v1.safetensors")
  sed -e "s/@FIXTURE_SHA256@/$digest/" "$REPO/node-agent/tests/data/corpus/$m.yaml" >"$d/template.yaml"
}

# run MODEL BACKEND: one local run with ITER iterations; prints the JSON outcome (a backend that
# is not ready exits 1, which is a row of the table here, not the end of the benchmark).
run() {
  local d=$WORK/$1 backend=$2
  sed -e "s/kind: tract/kind: $backend/" -e "s/iterations: [0-9]*/iterations: $ITER/" "$d/template.yaml" >"$d/$backend.yaml"
  { "$AGENT" local --output json --store "$d/store-$backend" "$d/$backend.yaml" 2>/dev/null || true; } | tail -1
}

# num WIDTH DECIMALS VALUE: VALUE right-aligned with DECIMALS places, or "-" when it is "-".
num() { if [[ $3 == - ]]; then printf "%$1s" -; else printf "%$1.$2f" "$3"; fi; }

echo "kiln-agent: $AGENT ($(basename "$(dirname "$AGENT")")); ONNX Runtime: $ORT_DYLIB_PATH; $(nproc) CPUs; $ITER warmup iterations"
printf '%-15s %-12s %10s %9s %9s %9s %9s %8s  %s\n' model backend compile_ms load_ms first_ms p50_ms p99_ms vs_best outcome
for m in "${MODELS[@]}"; do
  prepare "$m"
  outs=()
  for backend in "${BACKENDS[@]}"; do
    outs+=("$(run "$m" "$backend")")
  done
  best=$(printf '%s\n' "${outs[@]}" | jq -s '[.[] | select(.ready) | .p50Seconds] | min // 0')
  for i in "${!BACKENDS[@]}"; do
    jq -r --arg m "$m" --arg b "${BACKENDS[$i]}" --argjson best "$best" '
      def ms(k): if (.[k] // 0) > 0 then .[k] * 1000 else "-" end;
      [$m, $b, ms("compileSeconds"), ms("loadSeconds"), ms("firstSeconds"), ms("p50Seconds"), ms("p99Seconds"),
       (if .ready and $best > 0 then .p50Seconds / $best else "-" end),
       (if .ready then "ready\(if $b == "auto" then " on \(.engine)" else "" end), parity \(.parityMaxAbsError)" else "\(.reason): …\(.message | .[-100:])" end)] | @tsv' <<<"${outs[$i]}" |
      while IFS=$'\t' read -r mm b c l f p50 p99 vs outcome; do
        printf '%-15s %-12s %s %s %s %s %s %s  %s\n' "$mm" "$b" "$(num 10 1 "$c")" "$(num 9 2 "$l")" \
          "$(num 9 3 "$f")" "$(num 9 3 "$p50")" "$(num 9 3 "$p99")" "$(num 7 2 "$vs")$([[ $vs == - ]] && echo " " || echo x)" "$outcome"
      done
  done
done
