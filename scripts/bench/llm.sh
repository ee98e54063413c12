#!/usr/bin/env bash
# kiln's llama.cpp engine on the real GGUF models (scripts/ensure/llm-models.sh) side by side
# with llama.cpp's own llama-bench (scripts/ensure/llama-tools.sh) in one run, at batch 1 and
# the same thread count: per model its file size, kiln's load time, time to first token (the
# prompt's forward pass), prompt and decode tokens/s and peak resident memory, then
# llama-bench's prompt (pp) and decode (tg) tokens/s for the same prompt length and
# continuation, and kiln's rate as a ratio of llama-bench's (the goal is >= 0.95). Both
# collapse when threads outnumber free cores, so the machine's load is printed before and
# after: run it on a quiet machine (flock -x /tmp/kiln-quiet.lock where machines are shared).
#
#   scripts/bench/llm.sh [KILN_AGENT]     # default target/release/kiln-agent
#   KILN_BENCH_THREADS=2 KILN_BENCH_GENERATE=64 scripts/bench/llm.sh
set -euo pipefail

# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL="bench-llm"
AGENT=${1:-$REPO/target/release/kiln-agent}
THREADS=${KILN_BENCH_THREADS:-$(nproc)}
GENERATE=${KILN_BENCH_GENERATE:-32}
ITERATIONS=${KILN_BENCH_ITERATIONS:-5}
# About 60 tokens of prose for either tokenizer.
PROMPT="A kiln is a thermally insulated chamber, a type of oven, that produces temperatures \
sufficient to complete some process, such as hardening, drying, or chemical changes. Kilns \
have been used for millennia to turn objects made from clay into pottery, tiles and bricks."

[[ -x $AGENT ]] || die "no kiln-agent at $AGENT (cargo build --release -p kiln-agent)"
models=$(bash "$REPO/scripts/ensure/llm-models.sh")
bench=$(bash "$REPO/scripts/ensure/llama-tools.sh" llama-bench)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "machine: $(nproc) cores, threads $THREADS, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-20s %8s %7s %7s | %9s %9s %6s | %9s %9s %6s | %8s\n' model "size MB" "load s" "TTFT s" \
  "kiln pp/s" "bench pp/s" ratio "kiln tg/s" "bench tg/s" ratio "RSS MB"
for model in "$models"/*.gguf; do
  name=$(basename "$model" .gguf)
  object=${name//_/-} # a DNS-1123 name for the objects
  d=$work/$name
  mkdir -p "$d"
  ln -s "$model" "$d/model.gguf"
  "$AGENT" fixtures --reference llamacpp --model "$model" --prompt "$PROMPT" \
    --generate "$GENERATE" --fixture-version v1 -o "$d/fixture.safetensors" >/dev/null 2>"$d/fixtures.log" ||
    { tail -5 "$d/fixtures.log" >&2; die "kiln-agent fixtures failed on $name"; }
  n=$(python3 - "$d/fixture.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print(h["input/prompt"]["shape"][0])
PY
  )
  cat >"$d/kiln.yaml" <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: $object}
spec:
  source: {uri: "file://model.gguf", sha256: "$(sha256_of "$model")", size: $(stat -Lc %s "$model")}
  format: gguf
  inputs:
    - {name: prompt, dtype: i32, dims: [{symbol: len, min: 1, max: 512}]}
    - {name: generate, dtype: i32, dims: [{size: 1}]}
  fixtures:
    - {version: v1, uri: "file://fixture.safetensors", sha256: "$(sha256_of "$d/fixture.safetensors")"}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $object}
spec:
  modelRef: {name: $object}
  backend: {kind: llamacpp, llamacpp: {contextLength: 512, threads: $THREADS}}
  profiles: [{name: p, dims: {len: $n}}]
  warmup:
    iterations: $ITERATIONS
    fixtureVersion: v1
    outputs: [{name: logits, atol: 1.0e-3, rtol: 1.0e-3}, {name: tokens, atol: 0, rtol: 0}]
YAML
  # Not ready exits 1 with the reason in the outcome, which the table's script reports.
  "$AGENT" local --output json --store "$d/store" "$d/kiln.yaml" 2>"$d/agent.log" | tail -1 >"$d/outcome.json" || true
  [[ -s $d/outcome.json ]] ||
    { tail -5 "$d/agent.log" >&2; die "kiln-agent local gave no outcome on $name"; }
  "$bench" -m "$model" -t "$THREADS" -p "$n" -n "$GENERATE" -r 3 -o json 2>/dev/null >"$d/bench.json"
  python3 - "$d/outcome.json" "$d/bench.json" "$name" "$(stat -Lc %s "$model")" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
if not o.get("ready"):
    sys.exit("bench-llm: %s not ready: %s %s" % (sys.argv[3], o.get("reason"), o.get("message")))
g = o["generation"]
kiln_pp = g["promptTokens"] / g["prefillSeconds"]
kiln_tg = g["decodeTokensPerSecond"]
bench = json.load(open(sys.argv[2]))
pp = next(r["avg_ts"] for r in bench if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in bench if r["n_gen"] > 0 and r["n_prompt"] == 0)
rss = (o.get("peakMemoryBytes") or 0) / 1e6
print("%-20s %8.1f %7.3f %7.4f | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | %8.0f" % (
    sys.argv[3], int(sys.argv[4]) / 1e6, o["loadSeconds"], g["prefillSeconds"],
    kiln_pp, pp, kiln_pp / pp, kiln_tg, tg, kiln_tg / tg, rss))
PY
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(pp: a prompt of the fixture's token count in one batch; tg: $GENERATE tokens at batch 1; kiln's figures are the median over its $ITERATIONS warmup iterations; llama-bench's the mean of 3)"
