# shellcheck shell=bash
# shellcheck disable=SC2016 # single-quoted jq programs name jq's $variables, not the shell's
# Observations that fail when they saw nothing. A check that watches for something bad (a pod
# losing readiness, a duplicate Job, a write at steady state) passes just as well when its watch
# was empty, dead or started late, unless it proves that it covered its window. These helpers do:
# a watch must reach a resourceVersion read after the window, an absence is a watch from the
# window's first resourceVersion that ran to its end, a counter must be scraped and declared.
# Sourced by a test after lib.sh; failures go to the test's `die`.
#
#   watch_object FILE COLLECTION NAME [SECS]
#       Starts a watch (WATCH_PID) of the object NAME of COLLECTION (an API path such as
#       /api/v1/namespaces/NS/pods) into FILE, one JSON event per line, and returns once its
#       first event has arrived (within SECS, default 30). No resourceVersion is given, so the
#       API sends the object's current state first (ADDED) and then every change: state and
#       changes in one stream, with no gap between a read and a watch. One watch at a time;
#       watch_stop ends it (a test's teardown calls it).
#   ready_never_false FILE COLLECTION NAME [SECS]
#       Ends that window: reads the object's resourceVersion now, waits (SECS, default 30) until
#       the watch has delivered an event at or past it, stops the watch, and fails unless the
#       watch began with the object's state and every state up to there had condition Ready
#       True. An empty watch fails, and so does one that stopped short.
#   collection_rv VAR COLLECTION
#       Sets VAR to the collection's resourceVersion now: where an absence window begins.
#   events_since COLLECTION RV SECS FILE
#       Every event of COLLECTION after RV until SECS seconds from now, into FILE (the API replays
#       what happened since RV, then watches on until its timeoutSeconds). Fails unless the watch
#       ran all SECS and ended cleanly: an ERROR event (410 Expired: RV is older than the history
#       the API keeps) or an early end means the window was not covered.
#   expect_count FILE N DESC FILTER [JQ ARGS...]
#       Fails unless exactly N events of FILE match the jq FILTER (over an event: .type, .object).
#   assert_no_events_since COLLECTION RV SECS DESC FILTER [JQ ARGS...]
#       events_since, then expect_count 0: a real absence from RV to SECS seconds from now.
#   metric_sum VAR SAMPLE CMD...
#       Sets VAR to the sum of SAMPLE's series (e.g. kiln_operator_api_writes_total) in the
#       exposition (Prometheus text or OpenMetrics) CMD prints. Fails when CMD fails, when
#       neither SAMPLE's family nor any family of its component's prefix (kiln_operator_) is
#       declared, or a value is not a number, so a scrape that did not answer never reads as 0.
#       A family the component declares no series of yet is 0 (prometheus-client omits it). A
#       counter the component increments on every event, read at both ends of a window, covers
#       all of it, once it is shown to count at all (a caller's check that it is above 0).
#   wait_until SECS CMD...
#       Polls CMD every 0.2 s until it succeeds (returns 0) or SECS of wall-clock time pass (1).
#
# VAR, not output: a helper run in $(...) would die in the subshell only. resourceVersions are
# compared as numbers: the API calls them opaque, but on this cluster they are etcd's one
# increasing revision, which is what makes "reached" mean "delivered everything before".
#
# `bash e2e/tests/observe-lib.sh --self-test` checks the helpers against a fake kubectl and curl
# (canned streams, no cluster) in seconds, and exits nonzero when any case goes the wrong way.

# jq definitions over a watch event: its resourceVersion as a number (0 for an ERROR's Status)
# and the status of its object's Ready condition ("none" when it has none).
OBSERVE_JQ_DEFS='def rvn: (.object.metadata.resourceVersion // "0") | tonumber;
def ready: [.object.status.conditions[]? | select(.type == "Ready") | .status] | first // "none";'

# watch_events FILE: the complete events in FILE, compact, one per line (the line the watch may
# still be writing is left for the next look).
watch_events() {
  head -n "$(wc -l <"$1")" "$1" | jq -c .
}

# watch_summary FILE: how many events FILE holds and the resourceVersions they span.
watch_summary() {
  watch_events "$1" 2>/dev/null | jq -rs "$OBSERVE_JQ_DEFS"'map(select(.type != "ERROR") | rvn) as $r
    | "\(length) events" + (if ($r | length) > 0 then ", resourceVersion \($r | min) to \($r | max)" else "" end)'
}

# watch_err FILE: ": " and the start of what the watch into FILE printed on stderr, if anything.
watch_err() {
  local e
  e=$(head -c 300 "$1.err" 2>/dev/null)
  echo "${e:+: $e}"
}

watch_started() { [[ -n $(watch_events "$1" 2>/dev/null | head -1) ]]; }

watch_object() {
  local file=$1 coll=$2 name=$3 secs=${4:-30} end
  end=$((SECONDS + secs))
  watch_stop
  kubectl get --raw "$coll?watch=1&fieldSelector=metadata.name%3D$name&allowWatchBookmarks=true" \
    >"$file" 2>"$file.err" &
  WATCH_PID=$!
  until watch_started "$file"; do
    kill -0 "$WATCH_PID" 2>/dev/null || watch_started "$file" ||
      die "the watch of $name ended before it sent any state$(watch_err "$file")"
    ((SECONDS < end)) || die "the watch of $name sent no state in ${secs}s$(watch_err "$file")"
    sleep 0.1
  done
}

# watch_stop: ends the watch watch_object started, if one runs.
watch_stop() {
  [[ -n ${WATCH_PID:-} ]] || return 0
  kill "$WATCH_PID" 2>/dev/null || true
  wait "$WATCH_PID" 2>/dev/null || true
  WATCH_PID=
}

# watch_reach FILE RV SECS: waits until FILE holds an event at RV or later, or an ERROR event
# (which the verdict reports); 1 when SECS pass first.
watch_reach() {
  local end=$((SECONDS + $3))
  until watch_events "$1" 2>/dev/null |
    jq -se --argjson rv "$2" "$OBSERVE_JQ_DEFS"'any(.[]; .type == "ERROR" or rvn >= $rv)' >/dev/null; do
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

# The verdict on a watched window ending at $rv, over the slurped events: empty when the watch
# began with the object's state, failed nowhere, and every state had Ready True.
OBSERVE_READY_VERDICT=$OBSERVE_JQ_DEFS'[.[] | select(.type == "ERROR" or rvn <= $rv)] as $w
| ($w | map(select(.type == "ERROR"))) as $err
| ($w | map(select(.type == "ADDED" or .type == "MODIFIED") | select(ready != "True") | "\(ready) at \(rvn)")) as $bad
| if ($w | length) == 0 then "the watch saw nothing"
  elif ($err | length) > 0 then "the watch failed: \($err[0].object.message // "an ERROR event")"
  elif $w[0].type != "ADDED" then "the watch did not begin with the state (its first event: \($w[0].type))"
  elif any($w[]; .type == "DELETED") then "it was deleted"
  elif ($bad | length) > 0 then "Ready was not True: \($bad | join(", "))"
  else empty end'

ready_never_false() {
  local file=$1 coll=$2 name=$3 secs=${4:-30} obj rv problem
  obj=$(kubectl get --raw "$coll/$name") || die "cannot read $name to end its watched window"
  rv=$(jq -r '.metadata.resourceVersion // empty' <<<"$obj" 2>/dev/null) || rv=
  [[ $rv =~ ^[0-9]+$ ]] || die "$name has no numeric resourceVersion: '$rv'"
  if ! watch_reach "$file" "$rv" "$secs"; then
    watch_stop
    die "the watch of $name did not reach resourceVersion $rv in ${secs}s" \
      "(it holds $(watch_summary "$file")): its readiness over the window is unproved"
  fi
  watch_stop
  problem=$(watch_events "$file" | jq -rs --argjson rv "$rv" "$OBSERVE_READY_VERDICT") ||
    die "the watch of $name is unreadable: $(head -c 300 "$file")"
  [[ -z $problem ]] || die "$name over the watched window: $problem"
  echo "   $name watched to resourceVersion $rv ($(watch_summary "$file")): Ready True in each"
}

collection_rv() {
  local _cr_list _cr_rv
  _cr_list=$(kubectl get --raw "$2") || die "cannot list $2"
  _cr_rv=$(jq -r '.metadata.resourceVersion // empty' <<<"$_cr_list" 2>/dev/null) || _cr_rv=
  [[ $_cr_rv =~ ^[0-9]+$ ]] || die "$2 has no numeric resourceVersion: '$_cr_rv'"
  printf -v "$1" %s "$_cr_rv"
}

events_since() {
  local coll=$1 rv=$2 secs=$3 file=$4 start took rc=0 problem
  start=${EPOCHREALTIME/[.,]/}
  timeout $((secs + 30)) kubectl get --raw "$coll?watch=1&resourceVersion=$rv&timeoutSeconds=$secs" \
    >"$file" 2>"$file.err" || rc=$?
  took=$(((${EPOCHREALTIME/[.,]/} - start) / 1000))
  ((rc == 0)) || die "the watch of $coll from resourceVersion $rv failed (exit $rc)$(watch_err "$file")"
  # The API ends the watch at timeoutSeconds; an earlier clean end (an apiserver going away) left
  # the rest of the window unobserved.
  ((took >= secs * 1000)) ||
    die "the watch of $coll from resourceVersion $rv ended after $took ms, before its $secs s:" \
      "the window was not covered"
  problem=$(jq -rs 'map(select(.type == "ERROR") | .object.message // "an ERROR event") | join("; ")' "$file") ||
    die "the watch of $coll is unreadable: $(head -c 300 "$file")"
  [[ -z $problem ]] || die "the watch of $coll from resourceVersion $rv: $problem (the window was not covered)"
}

expect_count() {
  local file=$1 n=$2 desc=$3 filter=$4 found got
  shift 4
  found=$(jq -r "$@" "select($filter) | \"\(.type) \(.object.metadata.name)\"" "$file") ||
    die "cannot count $desc in $file"
  got=$(grep -c . <<<"$found" || true)
  ((got == n)) || die "$desc: $got, want $n${found:+ ($(paste -sd, <<<"$found"))}"
}

assert_no_events_since() {
  local file
  file=$(mktemp "${TMPDIR:-/tmp}/observe-events.XXXXXX")
  events_since "$1" "$2" "$3" "$file"
  expect_count "$file" 0 "$4" "$5" "${@:6}"
  rm -f "$file" "$file.err"
}

metric_sum() {
  local _ms_var=$1 _ms_sample=$2 _ms_family=$2 _ms_text _ms_sum
  shift 2
  [[ ! $_ms_sample =~ ^(.*)_(total|count|sum|bucket)$ ]] || _ms_family=${BASH_REMATCH[1]}
  _ms_text=$("$@") || die "cannot read metrics: $*"
  # Prometheus text names a counter's family with its _total, OpenMetrics without. A family
  # with no series yet (a replica that never wrote) is left out by prometheus-client, so it
  # reads 0, but only from the component's own exposition: one declaring a family of its prefix.
  grep -Eq "^# TYPE ($_ms_family|$_ms_sample) " <<<"$_ms_text" ||
    { [[ $_ms_family =~ ^([a-z]+_[a-z]+)_ ]] && grep -Eq "^# TYPE ${BASH_REMATCH[1]}_" <<<"$_ms_text"; } ||
    die "metric family $_ms_family is not declared by $*, nor any of its component's"
  _ms_sum=$(awk -v s="$_ms_sample" '{line = $0; sub(/\{[^}]*\}/, "", line); split(line, f, " ")}
    f[1] == s {if (f[2] !~ /^[0-9.eE+-]+$/) bad = f[2]; t += f[2]}
    END {if (bad != "") {print bad; exit 1}; print t + 0}' <<<"$_ms_text") ||
    die "$_ms_sample has a value that is not a number: $_ms_sum"
  printf -v "$_ms_var" %s "$_ms_sum"
}

wait_until() {
  local end=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

# --- self-test: the helpers against canned streams (defined only when run directly) ------------
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

# self_test_fakes DIR: DIR/bin/kubectl and DIR/bin/curl, answering from the files in $FAKE: watch
# (the stream a watch prints), rc (its exit status), early (a timed watch ends at once instead of
# after its timeoutSeconds), object (what a plain get prints), metrics (what curl prints).
self_test_fakes() {
  mkdir -p "$1/bin"
  cat >"$1/bin/kubectl" <<'SH'
#!/usr/bin/env bash
url=$3
echo "$url" >>"$FAKE/calls"
if [[ $url == *watch=1* ]]; then
  [[ ! -f $FAKE/watch ]] || cat "$FAKE/watch"
  [[ ! -f $FAKE/rc ]] || exit "$(cat "$FAKE/rc")"
  if [[ $url =~ timeoutSeconds=([0-9]+) ]]; then
    [[ -f $FAKE/early ]] || sleep "${BASH_REMATCH[1]}"
    exit 0
  fi
  exec sleep 10 # held open, as a watch is, until the helper stops it
fi
[[ -f $FAKE/object ]] || { echo "Error from server (NotFound)" >&2; exit 1; }
cat "$FAKE/object"
SH
  cat >"$1/bin/curl" <<'SH'
#!/usr/bin/env bash
[[ -f $FAKE/metrics ]] || { echo "curl: (7) Failed to connect" >&2; exit 7; }
cat "$FAKE/metrics"
SH
  chmod +x "$1/bin/kubectl" "$1/bin/curl"
}

# fake FILE [LINE...]: a fresh $FAKE (every case starts from one) holding FILE with the lines
# (none: an empty FILE).
fake() {
  rm -rf "$FAKE"
  mkdir -p "$FAKE"
  [[ -z ${1:-} ]] || : >"$FAKE/$1"
  (($# < 2)) || printf '%s\n' "${@:2}" >"$FAKE/$1"
}

# pod TYPE RV READY: a watch event of pod "serve" (READY "-": no Ready condition).
pod() {
  local conds='[{"type":"Ready","status":"'$3'"}]'
  [[ $3 != - ]] || conds='[]'
  printf '{"type":"%s","object":{"kind":"Pod","metadata":{"name":"serve","resourceVersion":"%s"},"status":{"conditions":%s}}}' "$1" "$2" "$conds"
}
# job TYPE RV OWNER: a watch event of a Job owned by OWNER.
job() {
  printf '{"type":"%s","object":{"kind":"Job","metadata":{"name":"j-%s","resourceVersion":"%s","ownerReferences":[{"name":"%s"}]}}}' "$1" "$2" "$2" "$3"
}
EXPIRED='{"type":"ERROR","object":{"kind":"Status","status":"Failure","message":"too old resource version: 200 (250)","reason":"Expired","code":410}}'

# case_expect pass|fail NEEDLE NAME CMD...: runs CMD in a subshell; a "fail" case must fail with
# NEEDLE in its output (failing for another reason is as wrong as passing).
case_expect() {
  local want=$1 needle=$2 name=$3 out rc=0 right=0
  shift 3
  out=$( ("$@") 2>&1) || rc=$?
  case $want in
    pass) ((rc == 0)) && right=1 ;;
    fail) ((rc != 0)) && [[ $out == *"$needle"* ]] && right=1 ;;
  esac
  CASES=$((CASES + 1))
  if ((right)); then
    printf 'ok     %-44s %s\n' "$name" "$(tail -1 <<<"$out" | sed 's/^ *//' | cut -c1-90)"
  else
    WRONG=$((WRONG + 1))
    printf 'WRONG  %-44s wanted %s%s, got exit %s: %s\n' "$name" "$want" "${needle:+ ($needle)}" "$rc" "$out"
  fi
}

PODS=/api/v1/namespaces/ns/pods
JOBS=/apis/batch/v1/namespaces/ns/jobs
# Deadlines of seconds, not one: the fake is a process, slow to start on a loaded machine.
watched_window() { watch_object "$OUT/w" "$PODS" serve 5 && ready_never_false "$OUT/w" "$PODS" serve 3; }
object_at() { printf '{"metadata":{"name":"serve","resourceVersion":"%s"}}\n' "$1" >"$FAKE/object"; }

self_test_readiness() {
  fake watch "$(pod ADDED 100 True)" "$(pod MODIFIED 105 True)"; object_at 105
  case_expect pass "" "readiness: True throughout" watched_window
  fake watch "$(pod ADDED 100 True)"; object_at 100
  case_expect pass "" "readiness: unchanged object, state only" watched_window
  fake watch "$(pod ADDED 100 True)"; printf '{"type":"MODIFIED","obj' >>"$FAKE/watch"; object_at 100
  case_expect pass "" "readiness: a half-written line is left" watched_window
  fake watch; object_at 105
  case_expect fail "sent no state" "readiness: empty stream" watched_window
  fake watch; object_at 105; : >"$OUT/empty"
  case_expect fail "did not reach" "readiness: empty file, check alone" ready_never_false "$OUT/empty" "$PODS" serve 1
  fake rc 1
  case_expect fail "ended before it sent any state" "readiness: watch exits at once" watched_window
  fake watch "$(pod ADDED 100 True)" "$(pod MODIFIED 103 False)" "$(pod MODIFIED 105 True)"; object_at 105
  case_expect fail "Ready was not True: False at 103" "readiness: a False in the window" watched_window
  fake watch "$(pod ADDED 100 True)"; object_at 105
  case_expect fail "did not reach resourceVersion 105" "readiness: stream stops short" watched_window
  fake watch "$(pod ADDED 100 True)" "$(pod MODIFIED 105 -)"; object_at 105
  case_expect fail "none at 105" "readiness: Ready condition gone" watched_window
  fake watch "$(pod ADDED 100 True)" "$(pod DELETED 105 True)"; object_at 105
  case_expect fail "deleted" "readiness: object deleted" watched_window
  fake watch "$(pod ADDED 100 True)" "$EXPIRED"; object_at 105
  case_expect fail "too old resource version" "readiness: ERROR event" watched_window
  fake watch "$(pod MODIFIED 105 True)"; object_at 105
  case_expect fail "did not begin with the state" "readiness: no initial state" watched_window
}

no_job_of_x() { assert_no_events_since "$JOBS" 200 1 "Jobs of x" '.type == "ADDED" and .object.metadata.ownerReferences[0].name == $o' --arg o x; }
asked_from_200() { no_job_of_x && grep -q "^$JOBS?watch=1&resourceVersion=200&timeoutSeconds=1$" "$FAKE/calls"; }
two_jobs_of_x() { events_since "$JOBS" 200 1 "$OUT/e" && expect_count "$OUT/e" 2 "Jobs of x" '.type == "ADDED" and .object.metadata.ownerReferences[0].name == "x"'; }
rv_is() { collection_rv got "$JOBS" && [[ $got == "$1" ]]; }

self_test_absence() {
  fake
  case_expect pass "" "absence: nothing over the whole window" asked_from_200
  fake watch "$(job ADDED 201 x)"
  case_expect fail "Jobs of x: 1, want 0" "absence: an ADDED Job" no_job_of_x
  fake watch "$(job ADDED 201 y)" "$(job MODIFIED 202 x)"
  case_expect pass "" "absence: only other Jobs, changes" no_job_of_x
  fake watch "$EXPIRED"
  case_expect fail "too old resource version" "absence: 410 Expired" no_job_of_x
  fake rc 1
  case_expect fail "failed (exit 1)" "absence: watch fails" no_job_of_x
  fake early x
  case_expect fail "before its 1 s" "absence: watch ends early" no_job_of_x
  fake watch "$(job ADDED 201 x)" "$(job ADDED 202 y)" "$(job ADDED 203 x)"
  case_expect pass "" "count: two of x" two_jobs_of_x
  fake object '{"kind":"JobList","metadata":{"resourceVersion":"300"},"items":[]}'
  case_expect pass "" "collection_rv: read" rv_is 300
  fake object '{"kind":"JobList","metadata":{},"items":[]}'
  case_expect fail "no numeric resourceVersion" "collection_rv: missing" rv_is 300
}

sum_is() { metric_sum got kiln_operator_api_writes_total curl -fsS http://127.0.0.1:1/metrics && [[ $got == "$1" ]]; }
waits_then_gives_up() { local t0=$SECONDS; ! wait_until 1 false && ((SECONDS - t0 <= 3)); }

self_test_metrics() {
  local type='# TYPE kiln_operator_api_writes counter'
  fake metrics "$type" 'kiln_operator_api_writes_total{kind="job"} 3' 'kiln_operator_api_writes_total{kind="status"} 4' \
    'kiln_operator_api_writes_created{kind="job"} 1.7e9' '# EOF'
  case_expect pass "" "metric: sum of series (OpenMetrics)" sum_is 7
  fake metrics '# TYPE kiln_operator_api_writes_total counter' 'kiln_operator_api_writes_total{kind="job"} 2'
  case_expect pass "" "metric: sum of series (Prometheus text)" sum_is 2
  fake metrics "$type" '# EOF'
  case_expect pass "" "metric: declared, no series yet: 0" sum_is 0
  fake
  case_expect fail "cannot read metrics" "metric: scrape fails" sum_is 0
  fake metrics '# TYPE kiln_operator_classes gauge' 'kiln_operator_classes 2'
  case_expect pass "" "metric: family without series, omitted by its component: 0" sum_is 0
  fake metrics '# TYPE kiln_agent_loads counter' 'kiln_agent_loads_total 9'
  case_expect fail "not declared" "metric: another component's exposition" sum_is 0
  fake metrics "$type" 'kiln_operator_api_writes_total{kind="job"} NaNx'
  case_expect fail "not a number" "metric: value not a number" sum_is 0
  case_expect pass "" "wait_until: succeeds" wait_until 2 true
  case_expect pass "" "wait_until: gives up on the clock" waits_then_gives_up
}

observe_self_test() {
  set -euo pipefail
  SELF_TEST_DIR=$(mktemp -d)
  trap 'rm -rf "$SELF_TEST_DIR"' EXIT
  self_test_fakes "$SELF_TEST_DIR"
  export FAKE=$SELF_TEST_DIR/fake PATH=$SELF_TEST_DIR/bin:$PATH
  OUT=$SELF_TEST_DIR/out
  mkdir -p "$OUT"
  die() { watch_stop; echo "FAIL: $*" >&2; exit 1; }
  CASES=0 WRONG=0
  self_test_readiness
  self_test_absence
  self_test_metrics
  echo "$((CASES - WRONG)) of $CASES cases went the right way"
  ((WRONG == 0))
}

[[ ${1:-} == --self-test ]] || { echo "usage: bash $0 --self-test" >&2; exit 2; }
observe_self_test
