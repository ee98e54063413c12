#!/usr/bin/env bash
# Benchmark (not a test): kiln-agent serve on a model directory laid out as a csi.kiln.dev volume
# holds it, against the engine it serves. For each model: `kiln-agent local` compiles and warms
# it (its steady p50 is the engine's own, in process: the bound); the stored artifact, its
# manifest and fixture become the volume; `kiln-agent serve` loads it; a real v2 client
# (tritonclient[http], binary tensor extension, one connection) sends the fixture's first sample
# WARM times as the agent's check would, then measures the first request after that and the p50
# of REQUESTS more. Prints both ratios: first request after warming over the p50 through the
# server (goal ≤ 1.2x), and the p50 through the server over the engine's own p50 (what HTTP, JSON
# header and the copy cost). Prints the machine's load before and after.
#
#   scripts/bench/serve.sh [REQUESTS] [MODEL...]     # defaults 200; squeezenet (the example) and
#                                                    # the corpus's ppocr-det and minilm-l6
#
# Uses target/release/kiln-agent when built (cargo build --release -p kiln-agent), else debug.
# Run it on a quiet machine: the engine and the client share the cores.
set -euo pipefail
REQUESTS=${1:-200}
shift || true
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
AGENT=$(release_or_debug kiln-agent)
MODELS=("$@")
((${#MODELS[@]} > 0)) || MODELS=(squeezenet ppocr-det minilm-l6)
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
PY=$("$REPO/scripts/ensure/v2-client.sh")
WORK=$(mktemp -d /tmp/kiln-bench-serve.XXXXXX)
SERVER=
trap '[[ -z $SERVER ]] || kill "$SERVER" 2>/dev/null; rm -rf "$WORK"' EXIT

# spec MODEL DIR: DIR/kiln.yaml (onnxruntime on the CPU, 20 warmup iterations) and its sources.
spec() {
  local m=$1 d=$2
  if [[ $m == squeezenet ]]; then
    cp "$REPO/examples/squeezenet/"{model.onnx,fixture-v1.safetensors,kiln.yaml} "$d/"
    FIXTURE=$d/fixture-v1.safetensors
    return
  fi
  local corpus
  corpus=$("$REPO/scripts/ensure/models.sh")
  cp "$corpus/$m.onnx" "$d/"
  FIXTURE=$d/$m-fixture-v1.safetensors
  "$AGENT" fixtures --reference onnxruntime --fixture-version v1 --model "$d/$m.onnx" \
    --inputs "$corpus/$m-inputs.safetensors" --out "$FIXTURE" >"$d/fixtures.log" 2>&1 ||
    { cat "$d/fixtures.log" >&2; exit 1; }
  sed -e "s/@FIXTURE_SHA256@/$(sha256_of "$FIXTURE")/" \
    -e "s/kind: tract/kind: onnxruntime/" "$REPO/node-agent/tests/data/corpus/$m.yaml" >"$d/kiln.yaml"
}

echo "kiln-agent: $AGENT; $(nproc) CPUs; $REQUESTS requests; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %-16s %9s %9s %9s %12s %12s\n' model engine engine_p50 serve_p50 first_ms first/p50 serve/engine
for m in "${MODELS[@]}"; do
  d=$WORK/$m
  mkdir -p "$d/volume"
  spec "$m" "$d"
  sed -i -e 's/iterations: [0-9]*/iterations: 20/' "$d/kiln.yaml"
  "$AGENT" local --output json --store "$d/store" "$d/kiln.yaml" 2>"$d/local.log" | tail -1 >"$d/local.json" ||
    { tail -5 "$d/local.log" >&2; echo "$m: local run failed: $(cat "$d/local.json")" >&2; continue; }
  key=$(jq -r .compileKey "$d/local.json")
  cp "$d/store/artifacts/$key/"{artifact,manifest.json} "$d/volume/"
  cp "$FIXTURE" "$d/volume/fixture.safetensors"
  jq -n --arg d "$(sha256_of "$d/volume/artifact")" \
    --arg f "$(sha256_of "$FIXTURE")" --arg e "$(jq -r .engine "$d/local.json")" \
    '{namespace: "bench", target: "m", revision: 1, class: "bench", digest: $d, engine: $e,
      mediaType: "x", fixture: $f, node: "local", pod: "bench/serve"}' >"$d/volume/kiln.json"
  port=$(free_port)
  "$AGENT" serve --model-dir "$d/volume" --host 127.0.0.1 --port "$port" 2>"$d/serve.log" &
  SERVER=$!
  for _ in $(seq 600); do curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  # The same client as the e2e test: the golden outputs checked first, then timed.
  out=$("$PY" "$REPO/e2e/testdata/v2_check.py" "127.0.0.1:$port" m "$FIXTURE" 1e-4 1e-3 20 "$REQUESTS") ||
    { tail -5 "$d/serve.log" >&2; echo "$m: client failed" >&2; kill "$SERVER"; SERVER=; continue; }
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
  engine_p50=$(jq -r '.p50Seconds * 1000' "$d/local.json")
  serve_p50=$(jq -r '.p50 * 1000' <<<"$out")
  first=$(jq -r '.first * 1000' <<<"$out")
  printf '%-12s %-16s %9.2f %9.2f %9.2f %11.2fx %11.2fx\n' "$m" "$(jq -r .engine "$d/local.json")" \
    "$engine_p50" "$serve_p50" "$first" "$(echo "$first / $serve_p50" | bc -l)" "$(echo "$serve_p50 / $engine_p50" | bc -l)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
