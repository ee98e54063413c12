#!/usr/bin/env bash
# Benchmark (not a test): kiln-agent serve on a model directory laid out as a csi.kiln.dev volume
# holds it, against the engine it serves and, under load, against KServe. Two modes.
#
# Latency (the default). For each model: `kiln-agent local` compiles and warms it; the stored
# artifact, its manifest and fixture become the volume; `kiln-agent serve` loads it. Then the
# shared harness (scripts/bench/harness.py) runs, interleaved for KILN_BENCH_ROUNDS rounds (5)
# after a discarded warmup pair, a real v2 client (tritonclient[http], binary tensor extension,
# a new connection each round) that sends the fixture's first sample 20 times as the agent's
# check would, then measures the first request after that and the p50 of REQUESTS more; and the
# engine's own run in `kiln-agent local` (a store hit, in process: the bound). It prints each
# side's median and min-max, the ratio with the range of the per-round ratios and a verdict for
# the p50 through the server against the engine's (goal: within 1.05x, the harness's 0.95x of
# the bound) and for the first request after warming over that p50 (each side's own); then the
# first request's goal, <= 1.2x through the server, judged on every round.
#
# Load (--load). The same volume served by `kiln-agent serve`, and the same .onnx source served
# by KServe's ModelServer on ONNX Runtime with its defaults (scripts/bench/serve_load.py kserve;
# scripts/ensure/kserve.sh), both on this machine's cores, both checked first against the
# fixture's golden outputs. Triton's perf_analyzer (scripts/ensure/perf-analyzer.sh; v2 over
# HTTP, binary tensors, the fixture's inputs) loads each at every concurrency in LEVELS, one
# level at a time, kiln then KServe, REPEATS rounds, each run once both servers are idle (what a
# run left queued is finished first). Prints a line per run, then per model, level
# and server: throughput median and min-max, p50 and p99 latency medians, runs that failed
# (perf_analyzer stops a run at its first failed request and says why; the reasons are listed),
# requests shed (kiln's 503s with Retry-After, from its /metrics: a full queue, not a wrong
# answer), the server's peak and current RSS after the level, and for kiln the bound of the
# engine alone (local's p50: min(c, cores)/p50 for tract, which runs one request per core;
# 1/p50 for engines whose run already uses every core) with kiln's share of it and kiln over
# KServe. perf_analyzer reads Triton's GET /v2/models/NAME/config before any load: when kiln does
# not answer it, both servers are loaded through the same relay that does
# (serve_load.py config-shim), and the output says so.
# Then shedding (perf_analyzer cannot measure it: it stops at the first refusal): kiln again with
# its own queue, loaded by Vegeta (scripts/ensure/vegeta.sh) one client at a time, at twice the
# engine's bound with at most SHED_LEVEL in flight (the goal: p99 <= 4x the one client's p50),
# and by SHED_LEVEL clients retrying at once (a retry storm); every answer checked (see
# shedding() and serve_shed.py).
#
#   scripts/bench/serve.sh [REQUESTS] [MODEL...]     # defaults 200; squeezenet (the example) and
#                                                    # the corpus's ppocr-det and minilm-l6
#   scripts/bench/serve.sh --load [MODEL...]         # about 5 minutes a model with the defaults
#   REPEATS=1 LEVELS="1 4" WINDOW_MS=1000 scripts/bench/serve.sh --load squeezenet   # a quick try
#
# Environment: KILN_AGENT (the binary; default the release build when there is one, else the
# debug one, where scripts/test.sh builds: release_or_debug in scripts/lib.sh); for --load:
# REPEATS (3), LEVELS ("1 4 16 64"), WINDOW_MS (perf_analyzer's measurement window, 3000),
# STABILITY (its stability percentage, 100: the rounds measure the spread), SHED_LEVEL (64;
# empty: no shedding rows), and the serve flags INSTANCES, MAX_QUEUE (64, the largest level, so
# that throughput is measured rather than shed; empty: the server's default) and
# REQUEST_TIMEOUT_MS, each passed only when the binary's `serve --help` lists it;
# KILN_BENCH_ROUNDS for the latency mode; KILN_BENCH_OUT keeps the harness's records and rows.md.
# The servers and the client share every core, so the load gate counts them all busy: it
# refuses (exit 3) a machine whose 1-minute load is above 0.25 unless KILN_BENCH_FORCE_NOISY=1,
# which marks every line NOISY.
set -euo pipefail
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
LOAD=0
[[ ${1:-} != --load ]] || { LOAD=1; shift; }
REQUESTS=200
if ((!LOAD)) && [[ ${1:-} =~ ^[0-9]+$ ]]; then REQUESTS=$1; shift; fi
AGENT=${KILN_AGENT:-$(release_or_debug kiln-agent)}
[[ -x $AGENT ]] || die "no kiln-agent at $AGENT (cargo build --release -p kiln-agent, or KILN_AGENT=PATH)"
MODELS=("$@")
((${#MODELS[@]} > 0)) || MODELS=(squeezenet ppocr-det minilm-l6)
ORT_DYLIB_PATH=$("$REPO/scripts/ensure-onnxruntime.sh")
export ORT_DYLIB_PATH
PY=$("$REPO/scripts/ensure/v2-client.sh")
HELPER=$REPO/scripts/bench/serve_load.py
SHED=$REPO/scripts/bench/serve_shed.py
HARNESS=$REPO/scripts/bench/harness.py
ROUND=$REPO/scripts/bench/local-round.sh
# The servers, the client and ONNX Runtime share every core: the load gate counts them all busy.
GATE=(--uses-cores "$(nproc)" --load-before "$LOAD_BEFORE")
[[ ${KILN_BENCH_FORCE_NOISY:-0} != 1 ]] || GATE+=(--force-noisy)
python3 "$HARNESS" --check-load "${GATE[@]}"
WORK=$(mktemp -d /tmp/kiln-bench-serve.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
OUT=${KILN_BENCH_OUT:-$WORK}
mkdir -p "$OUT"
: >"$OUT/rows.md"

# spec MODEL DIR: DIR/kiln.yaml (the example's tract; the corpus on onnxruntime, 20 warmup
# iterations) and its sources; sets FIXTURE and SOURCE (the .onnx).
spec() {
  local m=$1 d=$2
  if [[ $m == squeezenet ]]; then
    cp "$REPO/examples/squeezenet/"{model.onnx,fixture-v1.safetensors,kiln.yaml} "$d/"
    FIXTURE=$d/fixture-v1.safetensors SOURCE=$d/model.onnx
    return
  fi
  local corpus
  corpus=$("$REPO/scripts/ensure/models.sh")
  cp "$corpus/$m.onnx" "$d/"
  FIXTURE=$d/$m-fixture-v1.safetensors SOURCE=$d/$m.onnx
  "$AGENT" fixtures --reference onnxruntime --fixture-version v1 --model "$d/$m.onnx" \
    --inputs "$corpus/$m-inputs.safetensors" --out "$FIXTURE" >"$d/fixtures.log" 2>&1 ||
    { cat "$d/fixtures.log" >&2; exit 1; }
  sed -e "s/@FIXTURE_SHA256@/$(sha256_of "$FIXTURE")/" \
    -e "s/kind: tract/kind: onnxruntime/" "$REPO/node-agent/tests/data/corpus/$m.yaml" >"$d/kiln.yaml"
}

# volume MODEL DIR: `local` compiles and warms MODEL (DIR/local.json), then DIR/volume holds what
# the CSI plugin would mount. Status 1, saying why, when local fails.
volume() {
  local m=$1 d=$2
  mkdir -p "$d/volume"
  spec "$m" "$d"
  sed -i -e 's/iterations: [0-9]*/iterations: 20/' "$d/kiln.yaml"
  "$ROUND" --keep "$d/local.json" "$AGENT" "$d/store" "$d/kiln.yaml" >/dev/null ||
    { echo "$m: local run failed (above)" >&2; return 1; }
  local key
  key=$(jq -r .compileKey "$d/local.json")
  cp "$d/store/artifacts/$key/"{artifact,manifest.json} "$d/volume/"
  cp "$FIXTURE" "$d/volume/fixture.safetensors"
  jq -n --arg d "$(sha256_of "$d/volume/artifact")" \
    --arg f "$(sha256_of "$FIXTURE")" --arg e "$(jq -r .engine "$d/local.json")" \
    '{namespace: "bench", target: "m", revision: 1, class: "bench", digest: $d, engine: $e,
      mediaType: "x", fixture: $f, node: "local", pod: "bench/serve"}' >"$d/volume/kiln.json"
}

# wait_ready PORT PID LOG: until PORT serves model m, or die with LOG's end if PID exits first.
wait_ready() {
  for _ in $(seq 1200); do
    curl -fsS "http://127.0.0.1:$1/v2/models/m/ready" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { tail -5 "$3" >&2; die "the server on port $1 exited before it was ready"; }
    sleep 0.1
  done
  die "the server on port $1 was not ready in 120 s ($3)"
}

# start_kiln DIR PORT [FLAG...]: kiln-agent serve on DIR/volume; sets KILN_PID.
start_kiln() {
  local d=$1 port=$2
  shift 2
  "$AGENT" serve --model-dir "$d/volume" --host 127.0.0.1 --port "$port" "$@" 2>"$d/serve.log" &
  KILN_PID=$!
  PIDS+=("$KILN_PID")
  wait_ready "$port" "$KILN_PID" "$d/serve.log"
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

latency_mode() {
  local rounds=${KILN_BENCH_ROUNDS:-5} m d port
  echo "kiln-agent: $AGENT; $REQUESTS requests a round; $rounds rounds a model"
  for m in "${MODELS[@]}"; do
    d=$WORK/$m
    volume "$m" "$d" || continue
    port=$(free_port)
    start_kiln "$d" "$port"
    # Side A, the same client as the e2e test: the golden outputs checked first, then timed; side
    # B, the engine's own run in `local` (a store hit, 20 warmup iterations).
    python3 "$HARNESS" --name "$m" --a-label serve --bound engine --goal 0.95 --rounds "$rounds" --warmup \
      "${GATE[@]}" --json "$OUT/$m.json" --markdown="$OUT/rows.md" \
      --a "$(argv_json "$PY" "$REPO/e2e/testdata/v2_check.py" "127.0.0.1:$port" m "$FIXTURE" 1e-4 1e-3 20 "$REQUESTS")" \
      --b "$(argv_json "$ROUND" "$AGENT" "$d/store" "$d/kiln.yaml")" \
      --figure 'p50 s:lower' --a-get json:p50 --b-get json:p50Seconds \
      --figure 'first after warming / p50:lower' --a-get json:first/p50 --b-get json:firstRequestSeconds/p50Seconds ||
      { tail -5 "$d/serve.log" >&2; echo "$m: a round failed (above)" >&2; }
    stop "$KILN_PID"
    [[ -s $OUT/$m.json ]] && first_goal "$OUT/$m.json"
  done
  echo
  echo "| model and figure | serve median (min–max) | engine median (min–max) | ratio (range) | rounds | load before→after | verdict |"
  echo "|---|---|---|---|---|---|---|"
  cat "$OUT/rows.md"
}

# first_goal RECORD: the first request after warming over the p50 through the server against its
# goal (1.2x), from the harness's record: met when every round is within it, missed when none is.
first_goal() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
v = next(f for f in r["figures"] if f["name"].startswith("first"))["a"]
lo, hi = v["min"], v["max"]
verdict = "met" if hi <= 1.2 else "missed" if lo > 1.2 else "inconclusive"
print(f"  {r['name']}: first request after warming / p50 through the server: median {v['median']:.2f}x "
      f"(min-max {lo:.2f}-{hi:.2f}) over {len(v['values'])} rounds; goal <= 1.2x: {verdict}")
PY
}

# load_mode: every model, every level, REPEATS rounds of kiln then KServe; then the table.
load_mode() {
  REPEATS=${REPEATS:-3} WINDOW_MS=${WINDOW_MS:-3000} STABILITY=${STABILITY:-100} MAX_QUEUE=${MAX_QUEUE-64}
  read -ra LEVELS <<<"${LEVELS-1 4 16 64}"
  SHED_LEVEL=${SHED_LEVEL-64}
  PA=$("$REPO/scripts/ensure/perf-analyzer.sh")
  [[ -z $SHED_LEVEL ]] || VEGETA=$("$REPO/scripts/ensure/vegeta.sh")
  KSERVE=$("$REPO/scripts/ensure/kserve.sh")
  echo "kiln-agent: $AGENT; perf_analyzer: $PA; KServe: $KSERVE; Vegeta: ${VEGETA:-not used}"
  echo "$(nproc) CPUs; governor: $(governor); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "levels ${LEVELS[*]}; $REPEATS rounds; ${WINDOW_MS} ms windows, stability ${STABILITY}%"
  FLAGS=()
  serve_flags
  echo "kiln-agent serve flags: ${FLAGS[*]:-none}"
  local m
  for m in "${MODELS[@]}"; do
    load_model "$m" || echo "$m: skipped" >&2
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  [[ -s $WORK/rows.tsv || -s $WORK/shed.tsv ]] || die "nothing was measured"
  echo
  [[ ! -s $WORK/rows.tsv ]] || python3 "$HELPER" table "$WORK/rows.tsv" "$(nproc)"
  [[ ! -s $WORK/shed.tsv ]] || { echo; python3 "$SHED" table "$WORK/shed.tsv"; }
}

# serve_flags: FLAGS, the load flags this binary's `serve` lists, valued from the environment.
serve_flags() {
  local help pair flag value
  help=$("$AGENT" serve --help)
  for pair in "instances=${INSTANCES:-}" "max-queue=${MAX_QUEUE:-}" "request-timeout-ms=${REQUEST_TIMEOUT_MS:-}"; do
    flag=${pair%%=*} value=${pair#*=}
    [[ -n $value ]] || continue
    if grep -qE -- "--$flag( <|$)" <<<"$help"; then
      FLAGS+=("--$flag" "$value")
    else
      echo "note: this kiln-agent serve has no --$flag: not passed"
    fi
  done
}

governor() { cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo "not readable"; }

# load_model MODEL: the volume and the inputs, both servers up and checked, every level measured.
load_model() {
  local m=$1 d=$WORK/$1 c r s
  volume "$m" "$d" || return 1
  mapfile -t SHAPES < <(python3 "$HELPER" inputs "$FIXTURE" "$d/inputs")
  ENGINE=$(jq -r .engine "$d/local.json") ENGINE_P50=$(jq -r .p50Seconds "$d/local.json")
  echo "== $m: $ENGINE, p50 $(jq -r '.p50Seconds * 1000 * 100 | round / 100' "$d/local.json") ms in process (local); bound $(bound_rule)"
  declare -gA PORT PID URL
  PORT[kiln]=$(free_port)
  start_kiln "$d" "${PORT[kiln]}" "${FLAGS[@]}"
  PID[kiln]=$KILN_PID
  PORT[kserve]=$(free_port)
  start_kserve "$d" "${PORT[kserve]}"
  if ! check kiln || ! check kserve; then
    stop_servers
    return 1
  fi
  endpoints "$d"
  for c in "${LEVELS[@]}"; do
    for r in $(seq "$REPEATS"); do
      for s in kiln kserve; do measure "$m" "$s" "$c" "$r"; done
    done
  done
  stop_servers
  [[ -z $SHED_LEVEL ]] || shedding "$m" "$d"
}

# shedding MODEL DIR: kiln again with its own queue (the server's default; only INSTANCES
# passed), checked, then REPEATS rounds of three Vegeta runs of WINDOW_MS each, interleaved:
#   idle      one client, closed loop: the p50 the others are judged against;
#   overload  requests arriving at twice the engine's bound (open loop: arrivals do not wait for
#             answers), at most SHED_LEVEL (64) in flight: the goal, p99 <= 4x idle's p50;
#   storm     SHED_LEVEL clients in a closed loop that retry at once, ignoring Retry-After: the
#             worst a client can do; on this machine the client shares the server's cores, and its
#             CPU is printed.
# Every answer is judged by serve_shed.py (each 200 checked against the golden outputs). Rows in
# $WORK/shed.tsv.
shedding() {
  local m=$1 d=$2 port r run flags=() rate
  [[ -z ${INSTANCES:-} ]] || flags=(--instances "$INSTANCES")
  port=$(free_port)
  start_kiln "$d" "$port" "${flags[@]}"
  PID[kiln]=$KILN_PID PORT[kiln]=$port
  check kiln || { stop_servers; return 1; }
  rate=$(python3 -c "import sys; p = float(sys.argv[1]); print(round(2 * ($(bound_cores) / p)))" "$ENGINE_P50")
  echo "   shedding: kiln-agent serve ${flags[*]:-with its defaults} ($(curl -fsS "http://127.0.0.1:$port/v2/models/m" |
    jq -c '.parameters | {instances, workers, admitted, maxQueue}')); Vegeta: idle (c=1), overload ($rate/s, twice the bound, at most $SHED_LEVEL in flight), storm (c=$SHED_LEVEL, no back-off)"
  python3 "$SHED" target "$FIXTURE" "http://127.0.0.1:$port/v2/models/m/infer" "$d/target.json"
  for r in $(seq "$REPEATS"); do
    for run in idle overload storm; do
      case $run in
        idle) attack "$m" "$d" "$r" $run 0 1 ;;
        overload) attack "$m" "$d" "$r" $run "$rate" "$SHED_LEVEL" ;;
        storm) attack "$m" "$d" "$r" $run 0 "$SHED_LEVEL" ;;
      esac
    done
  done
  stop_servers
}

# attack MODEL DIR ROUND RUN RATE CLIENTS: one Vegeta run (RATE 0: a closed loop of CLIENTS), its
# answers judged; a row in $WORK/shed.tsv, a line out.
attack() {
  local m=$1 d=$2 r=$3 run=$4 rate=$5 c=$6 out=$2/shed-$4-$3 idle summary hwm rss vpid t0 t1
  idle=$(settle)
  "$VEGETA" attack -format=json -targets="$d/target.json" -rate="$rate" -workers="$c" -max-workers="$c" \
    -duration="${WINDOW_MS}ms" -timeout=60s >"$out.bin" 2>"$out.log" &
  vpid=$!
  # The client's CPU: its ticks from the start to just before the window ends.
  t0=$(awk '{print $14 + $15}' "/proc/$vpid/stat" 2>/dev/null || echo 0)
  sleep "$(bc -l <<<"$WINDOW_MS / 1000 * 0.9")"
  t1=$(awk '{print $14 + $15}' "/proc/$vpid/stat" 2>/dev/null || echo "$t0")
  wait "$vpid" || true
  "$VEGETA" encode --to json <"$out.bin" >"$out.jsonl"
  summary=$(python3 "$SHED" judge "$out.jsonl" "$FIXTURE" "$(bc -l <<<"$WINDOW_MS / 1000")")
  summary=$(jq -c --argjson cpu "$(bc -l <<<"($t1 - $t0) / $(getconf CLK_TCK) / ($WINDOW_MS / 1000 * 0.9)")" \
    --arg rate "$rate" --arg c "$c" '. + {client_cores: $cpu, rate: ($rate | tonumber), clients: ($c | tonumber)}' <<<"$summary")
  rm -f "$out.bin" "$out.jsonl"
  read -r hwm rss < <(memory_of "${PID[kiln]}")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$r" "$run" "$summary" "$hwm" "$rss" >>"$WORK/shed.tsv"
  echo "   $run round $r: $(jq -c '{answered, shed, wrong, other, p50_ms: (.p50_s * 1e5 | round / 100), p99_ms: (.p99_s * 1e5 | round / 100), client_cores: (.client_cores * 100 | round / 100)}' <<<"$summary")  RSS $((rss / 1024)) MiB (peak $((hwm / 1024)))  load $(cut -d' ' -f1 /proc/loadavg)  idle-wait $idle s"
}

# memory_of PID: the process's peak and current RSS in KiB ("0 0" once it is gone).
memory_of() {
  awk '/^VmHWM/ {h = $2} /^VmRSS/ {r = $2} END {print h + 0, r + 0}' "/proc/$1/status" 2>/dev/null || echo 0 0
}

# bound_cores: the runs the engine makes at once at the overload: the cores for tract, else one.
bound_cores() {
  if [[ $ENGINE == tract* ]]; then nproc; else echo 1; fi
}

bound_rule() {
  if [[ $ENGINE == tract* ]]; then
    echo "min(c, $(nproc) cores)/p50: tract runs one request per core"
  else
    echo "1/p50: a $ENGINE run already uses every core"
  fi
}

# start_kserve DIR PORT: KServe's ModelServer on ONNX Runtime, on the .onnx source.
start_kserve() {
  "$KSERVE/bin/python" "$HELPER" kserve --model-file "$SOURCE" --model-name m --http_port "$2" \
    --enable_grpc false >"$1/kserve.log" 2>&1 &
  PID[kserve]=$!
  PIDS+=("${PID[kserve]}")
  wait_ready "$2" "${PID[kserve]}" "$1/kserve.log"
}

stop_servers() {
  local p
  for p in "${PIDS[@]}"; do stop "$p"; done
  PIDS=()
}

# check SERVER: the fixture's golden outputs through it (the e2e test's client), once.
check() {
  local out
  out=$("$PY" "$REPO/e2e/testdata/v2_check.py" "127.0.0.1:${PORT[$1]}" m "$FIXTURE" 1e-4 1e-3) ||
    { echo "$1: the fixture's golden outputs did not come back (above)" >&2; return 1; }
  echo "   $1 (pid ${PID[$1]}): golden outputs within atol 1e-4 rtol 1e-3, max |error| $(jq -r .maxAbsError <<<"$out")"
}

# endpoints DIR: URL[SERVER], what perf_analyzer loads: the servers, or when kiln does not answer
# Triton's config route, the same relay in front of each.
endpoints() {
  local s
  if curl -fsS "http://127.0.0.1:${PORT[kiln]}/v2/models/m/config" >/dev/null 2>&1; then
    for s in kiln kserve; do URL[$s]=127.0.0.1:${PORT[$s]}; done
    return
  fi
  echo "   kiln answers no GET /v2/models/m/config (Triton's model configuration, which perf_analyzer reads first): both loaded through serve_load.py config-shim"
  for s in kiln kserve; do
    local port
    port=$(free_port)
    python3 "$HELPER" config-shim "$port" "127.0.0.1:${PORT[$s]}" m >"$1/shim-$s.log" 2>&1 &
    PIDS+=("$!")
    URL[$s]=127.0.0.1:$port
    for _ in $(seq 100); do curl -fsS "http://${URL[$s]}/v2/models/m/config" >/dev/null 2>&1 && break; sleep 0.1; done
  done
}

# measure MODEL SERVER LEVEL ROUND: one perf_analyzer run; a row in $WORK/rows.tsv, a line out.
measure() {
  local m=$1 s=$2 c=$3 r=$4 out=$WORK/$1/pa-$2-$3-$4 before after status=ok tput=0 p50=0 p99=0 shed=- hwm rss idle
  idle=$(settle)
  before=$(shed_so_far "$s")
  timeout $((WINDOW_MS * 12 / 1000 + 60)) "$PA" -i http -u "${URL[$s]}" -m m --concurrency-range "$c:$c:1" \
    -p "$WINDOW_MS" -s "$STABILITY" --percentile=99 --input-data "$WORK/$m/inputs" "${SHAPES[@]}" \
    -f "$out.csv" --verbose-csv >"$out.log" 2>&1 || status=$(failure "$out.log" $?)
  after=$(shed_so_far "$s")
  [[ $before == - || $after == - ]] || shed=$((after - before))
  if [[ $status == ok ]]; then
    read -r tput p50 p99 < <(awk -F, 'NR == 1 {for (i = 1; i <= NF; i++) h[$i] = i}
      NR == 2 {print $h["Inferences/Second"], $h["p50 latency"], $h["p99 latency"]}' "$out.csv")
  fi
  read -r hwm rss < <(memory_of "${PID[$s]}")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$s" "$c" "$r" "$status" "$tput" "$p50" "$p99" \
    "$shed" "$hwm" "$rss" "$ENGINE" "$ENGINE_P50" >>"$WORK/rows.tsv"
  printf '   c=%-3s round %s %-6s %8.1f infer/s  p50 %7.2f ms  p99 %7.2f ms  shed %-4s RSS %4d MiB (peak %d)  load %s  idle-wait %s s%s\n' \
    "$c" "$r" "$s" "$tput" "$(bc -l <<<"$p50 / 1000")" "$(bc -l <<<"$p99 / 1000")" "$shed" $((rss / 1024)) $((hwm / 1024)) \
    "$(cut -d' ' -f1 /proc/loadavg)" "$idle" "$([[ $status == ok ]] || echo "  $status")"
}

# settle: waits until neither server uses the CPU (under a tenth of a core for half a second, at
# most 60 s) and prints the seconds waited (idle-wait, on the line of the run that follows). A
# client that stops leaves its requests queued, and both servers run what they admitted: that
# work must not fall in the next run's time.
settle() {
  local start=$SECONDS before after
  while ((SECONDS - start < 60)); do
    before=$(cpu_ticks)
    sleep 0.5
    after=$(cpu_ticks)
    (((after - before) * 10 < $(getconf CLK_TCK) / 2)) && break
  done
  echo $((SECONDS - start))
}

# cpu_ticks: the CPU time both servers used so far, in clock ticks.
cpu_ticks() {
  cat "/proc/${PID[kiln]}/stat" "/proc/${PID[kserve]}/stat" 2>/dev/null | awk '{n += $14 + $15} END {print n + 0}'
}

# shed_so_far SERVER: kiln's requests shed for a full queue so far (its /metrics), else -.
shed_so_far() {
  local text
  [[ $1 == kiln ]] || { echo -; return; }
  text=$(curl -fsS "http://127.0.0.1:${PORT[kiln]}/metrics" 2>/dev/null) || { echo -; return; }
  awk '/^kiln_inference_request_failure_total\{/ && /reason="queue_full"/ {n += $NF} END {print n + 0}' <<<"$text"
}

# failure LOG STATUS: why perf_analyzer stopped, on one line.
failure() {
  local why
  why=$(grep -m1 -o 'had error: .*' "$1" | cut -c12- || true)
  [[ -n $why ]] || why=$(grep -v '^[[:space:]]*$' "$1" | tail -1 || true)
  [[ $2 != 124 ]] || why="timed out; $why"
  echo "failed (exit $2): $why" | tr '\t' ' ' | cut -c1-160
}

if ((LOAD)); then load_mode; else latency_mode; fi
