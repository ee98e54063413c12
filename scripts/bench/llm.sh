#!/usr/bin/env bash
# kiln's llama.cpp engine on the real GGUF models (scripts/ensure/llm-models.sh) against
# llama.cpp's own llama-bench (scripts/ensure/llama-tools.sh), at batch 1 and the same thread
# count, through the shared harness (scripts/bench/harness.py): per model, kiln and llama-bench
# run interleaved (kiln, llama-bench, kiln, ...) for ROUNDS rounds after one discarded warmup
# pair, and for prompt (pp) and decode (tg) tokens/s it prints each side's median and min-max,
# kiln's ratio of the medians with the range of the per-round ratios, and a verdict against the
# goal (0.95x) only where that range allows one ("inconclusive (spread a-b)" otherwise). Then
# the model's file size and, from kiln's last round, its load time, time to first token (the
# prompt's forward pass) and peak resident memory; at the end the README rows.
#
# Both sides collapse when threads outnumber free cores: the harness reads the load at the
# start and refuses (exit 3) when the 1-minute load is above the cores less THREADS, unless
# KILN_BENCH_FORCE_NOISY=1, which marks every line NOISY. Run it on a quiet machine
# (flock -x /tmp/kiln-quiet.lock where machines are shared).
#
#   scripts/bench/llm.sh [KILN_AGENT]     # default target/release/kiln-agent
#   KILN_BENCH_THREADS=2 KILN_BENCH_GENERATE=64 scripts/bench/llm.sh
#   KILN_BENCH_THREADS=1 KILN_BENCH_PIN=1 KILN_BENCH_ROUNDS=7 scripts/bench/llm.sh
#
# Environment:
#   KILN_BENCH_THREADS      threads, the same on both sides (default: nproc)
#   KILN_BENCH_GENERATE     tokens decoded per run (32)
#   KILN_BENCH_ITERATIONS   kiln's warmup iterations per round; its figures are their median (5)
#   KILN_BENCH_ROUNDS       interleaved rounds per model (5; 1 gives figures but no verdict)
#   KILN_BENCH_WARMUP       1: a first pair, discarded, which also compiles kiln's store (1)
#   KILN_BENCH_REPETITIONS  llama-bench's -r per round; its figures are their mean (3)
#   KILN_BENCH_GOAL         the ratio a verdict is judged against (0.95)
#   KILN_BENCH_PIN          a CPU list both sides run under (taskset -c; default: not pinned)
#   KILN_BENCH_FORCE_NOISY  1: run although the machine is busy, every line marked NOISY
#   KILN_BENCH_OUT          a directory kept for MODEL.json (the harness's record) and rows.md
#                           (default: a temporary one, removed at the end)
set -euo pipefail
# The load before anything here runs: preparing the fixtures and earlier models raises it.
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL="bench-llm"
AGENT=${1:-$REPO/target/release/kiln-agent}
THREADS=${KILN_BENCH_THREADS:-$(nproc)}
GENERATE=${KILN_BENCH_GENERATE:-32}
ITERATIONS=${KILN_BENCH_ITERATIONS:-5}
ROUNDS=${KILN_BENCH_ROUNDS:-5}
REPETITIONS=${KILN_BENCH_REPETITIONS:-3}
GOAL=${KILN_BENCH_GOAL:-0.95}
HARNESS=$REPO/scripts/bench/harness.py
# About 60 tokens of prose for either tokenizer.
PROMPT="A kiln is a thermally insulated chamber, a type of oven, that produces temperatures \
sufficient to complete some process, such as hardening, drying, or chemical changes. Kilns \
have been used for millennia to turn objects made from clay into pottery, tiles and bricks."

# The machine's state, which the load gate and every comparison share.
GATE=(--threads "$THREADS" --load-before "$LOAD_BEFORE")
[[ -z ${KILN_BENCH_PIN:-} ]] || GATE+=(--pin "$KILN_BENCH_PIN")
[[ ${KILN_BENCH_FORCE_NOISY:-0} != 1 ]] || GATE+=(--force-noisy)
# What every comparison passes the harness, besides its sides and figures.
COMMON=("${GATE[@]}" --bound llama-bench --goal "$GOAL" --rounds "$ROUNDS")
[[ ${KILN_BENCH_WARMUP:-1} != 1 ]] || COMMON+=(--warmup)

[[ -x $AGENT ]] || die "no kiln-agent at $AGENT (cargo build --release -p kiln-agent)"
# Refuse a busy machine before the slow preparation (exit 3, the reason on stderr).
python3 "$HARNESS" --check-load "${GATE[@]}"
models=$(bash "$REPO/scripts/ensure/llm-models.sh")
bench=$(bash "$REPO/scripts/ensure/llama-tools.sh" llama-bench)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${KILN_BENCH_OUT:-$work}
mkdir -p "$out"
: >"$out/rows.md"

echo "kiln-agent: $AGENT; llama-bench: $bench; $ROUNDS rounds a model, goal ${GOAL}x"
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
  echo
  # kiln's prefill rate is its prompt over the median prefill time; llama-bench's records are
  # one for the prompt (n_gen 0) and one for the decode (n_prompt 0).
  python3 "$HARNESS" --name "$name" "${COMMON[@]}" --json "$out/$name.json" --markdown="$out/rows.md" \
    --a "$(argv_json "$REPO/scripts/bench/local-round.sh" --keep "$d/outcome.json" "$AGENT" "$d/store" "$d/kiln.yaml")" \
    --b "$(argv_json "$bench" -m "$model" -t '{threads}' -p "$n" -n "$GENERATE" -r "$REPETITIONS" -o json)" \
    --figure 'pp tok/s:higher' --a-get json:generation.promptTokens/generation.prefillSeconds \
    --b-get 'json:[n_gen=0].avg_ts' \
    --figure 'tg tok/s:higher' --a-get json:generation.decodeTokensPerSecond \
    --b-get 'json:[n_prompt=0].avg_ts'
  python3 - "$d/outcome.json" "$(stat -Lc %s "$model")" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
print("  %.1f MB; kiln's last round: load %.3f s, TTFT %.4f s, peak RSS %.0f MB" % (
    int(sys.argv[2]) / 1e6, o["loadSeconds"], o["generation"]["prefillSeconds"],
    (o.get("peakMemoryBytes") or 0) / 1e6))
PY
done
echo
echo "(pp: a prompt of the fixture's token count in one batch; tg: $GENERATE tokens at batch 1; per round kiln's figures are the median over its $ITERATIONS warmup iterations, llama-bench's the mean of $REPETITIONS)"
echo "| model and figure | kiln median (min–max) | llama-bench median (min–max) | ratio (range) | rounds | load before→after | verdict |"
echo "|---|---|---|---|---|---|---|"
cat "$out/rows.md"
