#!/usr/bin/env bash
# The fault table: kiln installed by its chart with the store on the cluster's registry, serving
# the example model; then each fault below, repeated KILN_E2E_FAULT_TRIALS times, each trial on a
# fresh revision of the target (a new profile name, so a new compile key). By default the two
# cases whose trials alternate two variants (artifact-corrupt, csi-plugin) run twice, so both
# variants run, and every other case once: every case and variant on every run, in about half
# the time of two trials each (988 s on 2026-11-29), which CI's budget needed.
#
#   operator-reconcile  the operator is SIGKILLed right after a spec change (mid-reconcile)
#   operator-compile    the operator is SIGKILLed while the compile Job runs
#   agent-download      the agent is SIGKILLed mid-download (traffic to its pod shaped to
#                       2 Mbit/s, killed in phase Pulling once its partial file holds bytes);
#                       the new agent resumes after the kept bytes
#   agent-warmup        the agent is SIGKILLed in phase Warming (a 400-iteration warmup)
#   registry-down       the registry is down for 60 s across a spec change (the target says
#                       StoreUnavailable meanwhile)
#   apiserver-restart   the apiserver is stopped for 10 s right after a spec change
#   class-change        the node's class label changes (kiln.dev/cpu-level): readiness is
#                       withdrawn, a compile is scheduled for the new class and refused on this
#                       hardware (the node stays not ready); the label changes back and the
#                       real class's stored artifact is warmed again without a compile
#
#   artifact-corrupt    the served artifact's blob in the registry is flipped (odd trials) or
#                       truncated (even), the node's cache emptied, the agent restarted: fail
#                       closed; the blob repaired: served again
#   csi-plugin          the CSI node plugin (kiln-csi) is SIGKILLed just before (odd trials) or
#                       just after (even) a pod with the model volume is created, so the kill
#                       meets its publish before, during or after it (the note says which; a
#                       publish takes milliseconds); the new plugin registers again, the pod
#                       mounts the bytes its kiln.json names, and once the pod is deleted
#                       nothing is left mounted or in the cache's published/
#   serving-pod         a serving pod (kiln-agent serve on the model volume, kiln.dev/protocol
#                       oip-v2, 400 warmup requests) has its server SIGKILLed while the agent
#                       warms it through the server (gate reason WarmingServer; the note says
#                       if the kill came later): its gate is never True before the kubelet has
#                       counted the restart and the restarted server was checked again, then True
#
#   engine-segfault     a second target on the same node whose engine (ONNX Runtime) segfaults
#   engine-abort        / aborts / spins past its deadline while the agent loads and warms it:
#   engine-spin         its row Failed EngineCrashed naming the signal (Timeout for the spin),
#                       the agent process the same throughout, the example target Ready and its
#                       pod gate True at every look (engines/src/pipeline/isolate/)
#   engine-memory       a second target whose 212-byte model asks ONNX Runtime for 4 GiB, its
#                       compile Job limited to 2Gi: the Job's engine process is stopped at the
#                       limit (class row MemoryBudgetExceeded), the example target Ready
#
#   The engine rows need the agent built with the test-only cargo feature fault-injection (a
#   model carrying kiln-fault-inject:load:<fault> makes the engine's process crash on demand;
#   ONNX Runtime cannot be made to on purpose): this script builds it aside
#   (target/fault-injection/kiln-agent) and runs the whole table on it; product images never
#   carry the feature.
#
# (A tag moved to another valid manifest is the end of kiln.sh; flipped, truncated and replaced
# store entries are also rows of the agent's hostile corpus, node-agent/tests/hostile.rs.)
#
# A killed component is SIGKILLed (no chance to clean up) and its pod deleted, as a node loss or an
# OOM kill would leave it. A trial survives when the target converges (status revision, class
# compile key and digest, the node's row Ready with that digest and the pod gate True) within its
# deadline; "lost" counts what was recorded before the fault and missing after: a known-good
# revision gone from status, or its entry gone from the registry. KILN_E2E_FAULT_CASES
# (space-separated names) runs only those cases. Prints the table; fails when any trial did not
# survive or lost anything.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
source "$(dirname "$0")/observe-lib.sh"
ensure_busybox
test_namespace
NS=$TEST_NS
REL=$NS
TARGET=squeezenet-cpu
REPOSITORY=kiln-e2e/$NS
TRIALS=${KILN_E2E_FAULT_TRIALS:-}
WORK=$(mktemp -d /var/tmp/kiln-e2e-faults.XXXXXX)
chmod 755 "$WORK"
REAL=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
NETNS=kiln-e2e
SHAPED=()
TRUNCATED=
cleanup() {
  local dev
  for dev in "${SHAPED[@]}"; do ip netns exec "$NETNS" tc qdisc del dev "$dev" root 2>/dev/null || true; done
  [[ -z $TRUNCATED ]] || cp "$WORK/blob.orig" "$TRUNCATED" 2>/dev/null || true
  "$E2E_DIR/cluster" start registry >/dev/null 2>&1 || true
  "$E2E_DIR/cluster" start kube-apiserver >/dev/null 2>&1 || true
  kubectl label node "$REAL" kiln.dev/cpu-level- >/dev/null 2>&1 || true
  kubectl -n "$NS" delete compiledtarget --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  helm uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
  kubectl label node "$REAL" "$NS.ready.kiln.dev/$TARGET-" >/dev/null 2>&1 || true
  kubectl delete kilnnode "$REAL" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
die() {
  kubectl -n "$NS" get compiledtarget "$TARGET" -o json 2>/dev/null | jq '.status | del(.revisions)' >&2 || true
  kiln_diagnose "$NS" "$REAL"
  fail "$*"
}

ENGINE_CASES="engine-segfault engine-abort engine-spin engine-memory"
engine_cases_wanted() {
  local c
  for c in $ENGINE_CASES; do [[ " ${KILN_E2E_FAULT_CASES:-$c} " == *" $c "* ]] && return 0; done
  return 1
}
if engine_cases_wanted && [[ -z ${KILN_E2E_AGENT_BIN:-} ]]; then
  # Built in the target directory in use (cargo keeps both feature sets' objects, so after the
  # suite's `cargo test --features fault-injection` this only links) and copied into this
  # test's own directory; the other tests' images come from scripts/test/product-bins.sh, which
  # builds the product again whatever this left behind.
  (cd "$REPO" && cargo build -q --locked -p kiln-agent --bin kiln-agent --features fault-injection &&
    install -D "${CARGO_TARGET_DIR:-target}/debug/kiln-agent" "$WORK/fault-agent/kiln-agent") ||
    die "cannot build the fault-injection agent"
  export KILN_E2E_AGENT_BIN=$WORK/fault-agent/kiln-agent
fi
# This image's agent carries the hook on purpose; kiln_image refuses it everywhere else.
export KILN_E2E_FAULT_AGENT=1
kiln_images "$WORK"
kiln_example_dirs "$WORK"
kiln_fresh_crds
# KILN_E2E_FAULT_RUST_LOG: the operator's and agent's RUST_LOG, to look into a failing case.
LOG_ARGS=()
[[ -z ${KILN_E2E_FAULT_RUST_LOG:-} ]] || for c in operator agent; do
  LOG_ARGS+=(--set "$c.extraEnv[0].name=RUST_LOG" --set "$c.extraEnv[0].value=${KILN_E2E_FAULT_RUST_LOG//,/\\,}")
done
# The engine-spin row: loading and warming may take 2 x 60 s before the engine is killed.
LOG_ARGS+=(--set "agent.extraEnv[1].name=KILN_WARMUP_DEADLINE_SECONDS" --set-string "agent.extraEnv[1].value=60")
[[ -n ${KILN_E2E_FAULT_RUST_LOG:-} ]] || LOG_ARGS+=(--set "agent.extraEnv[0].name=RUST_LOG" --set "agent.extraEnv[0].value=info")
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" "${LOG_ARGS[@]}" || die "kiln did not come up"

# The example's ModelArtifact as it is; the target is applied by `revise`.
python3 -c 'import sys, yaml; [print("---\n" + yaml.safe_dump(d)) for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ModelArtifact"]' \
  "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null
serving_pod "$NS" "$TARGET" "$REAL"

# revise PROFILE [ITERATIONS]: the target with one profile named PROFILE (batch 1: same model,
# new compile key) and that many warmup iterations.
revise() {
  example_target "$TARGET" "$1" "${2:-5}" "{knownGoodHistory: 100}" | kubectl -n "$NS" apply -f - >/dev/null
  GEN=$(kubectl -n "$NS" get compiledtarget "$TARGET" -o jsonpath='{.metadata.generation}')
}
ct() { kubectl -n "$NS" get compiledtarget "$TARGET" -o json; }
row() { kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq -c --arg ns "$NS" --arg t "$TARGET" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
gate() { kubectl -n "$NS" get pod serve -o json | jq -r '.status.conditions[]? | select(.type == "kiln.dev/warm") | .status'; }
# converged: the target reconciled generation $GEN into a revision whose one class has a digest,
# and the node serves exactly that digest, Ready, with the pod's gate True. Sets KEY and DIGEST.
converged() {
  local s r
  s=$(ct) && r=$(row) || return 1
  jq -e --argjson g "$GEN" '.status.revision as $r | .status.observedGeneration == $g
    and (.status.classes | length) == 1 and (.status.classes[0].artifactDigest // "") != ""
    and any(.status.revisions[]; .generation == $g and .number == $r)' <<<"$s" >/dev/null || return 1
  KEY=$(jq -r '.status.classes[0].compileKey' <<<"$s")
  DIGEST=$(jq -r '.status.classes[0].artifactDigest' <<<"$s")
  jq -e --arg d "$DIGEST" --argjson rev "$(jq .status.revision <<<"$s")" \
    '.phase == "Ready" and .revision == $rev and (.artifactDigest | endswith($d))' <<<"$r" >/dev/null || return 1
  [[ $(gate) == True ]]
}
# jobs_for KEY: how many compile Jobs were created for KEY; job_names KEY: their names.
jobs_for() { job_names "$1" | grep -c . || true; }
job_names() {
  kubectl -n "$NS" get jobs -o json |
    jq -r --arg k "$1" '.items[] | select(.metadata.annotations["kiln.dev/compile-key"] == $k) | .metadata.name' | sort
}
# known_good: "number compileKey" of every known-good revision in status.
known_good() { ct | jq -r '.status.revisions[] | select(.knownGood) | "\(.number) \(.artifacts[0].compileKey)"' | sort; }
has_tag() { curl -fsS -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$1"; }
# lost BEFORE: known-good revisions (and their registry entries) recorded in BEFORE and gone now.
lost() {
  local n=0 number key
  while read -r number key; do
    [[ -n $number ]] || continue
    if ! known_good | grep -qx "$number $key" || ! has_tag "$key"; then
      n=$((n + 1)); echo "   lost: revision $number ($key)" >&2
    fi
  done <<<"$1"
  echo "$n"
}
# pid_of PATTERN: the one host process whose command line starts with PATTERN (containers' processes
# are visible from here).
pid_of() {
  local pids
  pids=$(pgrep -f "^$1") || return 1
  [[ $(wc -l <<<"$pids") == 1 ]] || die "several processes match $1: $pids"
  echo "$pids"
}
# kill_component COMPONENT: SIGKILL its process, delete its pod, wait until the replacement runs.
kill_component() {
  local comp=$1 pattern pod
  case $comp in
    operator) pattern='/bin/kiln-operator' ;;
    agent) pattern='/bin/kiln-agent run' ;;
  esac
  pod=$(kubectl -n "$NS" get pod -l "app.kubernetes.io/component=$comp" -o jsonpath='{.items[0].metadata.name}')
  kill -KILL "$(pid_of "$pattern")" || die "no $comp process"
  kubectl -n "$NS" delete pod "$pod" --wait=false >/dev/null
  replaced() {
    kubectl -n "$NS" get pod -l "app.kubernetes.io/component=$comp" -o json |
      jq -e --arg old "$pod" '[.items[] | select(.metadata.name != $old and .status.phase == "Running")] | length == 1'
  }
  wait_for "a new $comp pod" 120 replaced
}
# shape: everything the node sends to the agent's pod at 2 Mbit/s (a token bucket on the host side
# of its veth; only tbf is certain to be in the kernel, so the artifact pull and the API watch
# traffic share it, which the watches' few KiB/s do not notice).
shape() {
  local pid link dev
  pid=$(pid_of '/bin/kiln-agent run') || die "no agent process"
  # "2: eth0@if13: …": the host-side peer's ifindex.
  link=$(nsenter -t "$pid" -n ip -o link show eth0 | sed -n 's/^[0-9]*: eth0@if\([0-9]*\):.*/\1/p')
  [[ -n $link ]] || die "agent pod's eth0"
  dev=$(ip netns exec "$NETNS" ip -o link | awk -F': ' -v i="$link" '$1 == i {sub(/@.*/, "", $2); print $2}')
  [[ -n $dev ]] || die "no host veth with ifindex $link"
  ip netns exec "$NETNS" tc qdisc add dev "$dev" root tbf rate 2mbit burst 16kb latency 2s || die "tc on $dev"
  SHAPED+=("$dev")
}
unshape() {
  local dev
  for dev in "${SHAPED[@]}"; do ip netns exec "$NETNS" tc qdisc del dev "$dev" root 2>/dev/null || true; done
  SHAPED=()
}
# row_phase REVISION PHASE: the node prepares REVISION in PHASE, as its own row or, while it
# serves an older revision, as that row's desiredRevision and message.
row_phase() {
  row | jq -e --argjson g "$1" --arg p "$2" '(.revision == $g and .phase == $p)
    or (.desiredRevision == $g and (.message // "" | endswith(": " + $p)))'
}
target_revision() { ct | jq -r '.status.revision // 0'; }
wait_revision_after() { # wait until status.revision > $1 (the spec change was reconciled)
  local before=$1
  newer() { (($(target_revision) > before)); }
  wait_for "a new revision after $before" 120 newer
}

echo "== baseline: the example target Ready"
revise base
wait_for "baseline converged" 300 converged
echo "   revision $(target_revision), key ${KEY:0:12}…, digest ${DIGEST:0:12}…"

TABLE=()
FAILED=0
N=0
# trial CASE FN: one trial of CASE; FN injects the fault after `revise` and returns when the
# fault is over; the trial then waits for convergence and counts what was lost.
trial() {
  local name=$1 fn=$2 before t0 lost_n ok=1 note
  before=$(known_good)
  N=$((N + 1))
  t0=$SECONDS
  NOTE=
  "$fn" "$name-$N" || ok=0
  if ((ok)) && ! wait_until 240 converged; then
    ok=0
  fi
  if ((ok)) && [[ -n ${EXPECT_JOBS:-} ]] && (($(jobs_for "$KEY") != EXPECT_JOBS)); then
    echo "   $name: $(jobs_for "$KEY") compile Jobs for ${KEY:0:12}…, expected $EXPECT_JOBS" >&2
    ok=0
  fi
  lost_n=$(lost "$before")
  note="${NOTE:-}"
  printf '   %-20s trial: %s in %ss, lost %s %s\n' "$name" "$( ((ok)) && echo survived || echo FAILED)" "$((SECONDS - t0))" "$lost_n" "$note"
  RESULTS+=("$name $ok $lost_n")
  ((ok && lost_n == 0)) || FAILED=1
}
RESULTS=()

# --- the faults ---------------------------------------------------------------------------------
f_operator_reconcile() {
  revise "$1"
  kill_component operator
}
f_operator_compile() {
  local before
  before=$(kubectl -n "$NS" get jobs -o name | sort)
  revise "$1"
  # The Job active: its pod scheduled or its compile container running (the compile takes ~4 s
  # here, about one poll of this loop, so either may be what the kill meets; the note says which).
  new_job_active() {
    comm -13 <(echo "$before") <(kubectl -n "$NS" get jobs -o name | sort) | grep -q . &&
      kubectl -n "$NS" get pods -l job-name -o json |
      jq -e '[.items[] | select(.status.phase == "Pending" or .status.phase == "Running")] | length > 0'
  }
  wait_for "the compile Job active" 60 new_job_active
  NOTE="(killed with the compile pod $(kubectl -n "$NS" get pods -l job-name -o json | jq -r '[.items[]
    | select(.status.phase == "Pending" or .status.phase == "Running")
    | if (.status.containerStatuses[]?.state.running) then "running" else .status.phase end] | first // "finished"'))"
  kill_component operator
}
f_agent_download() {
  local rev
  rev=$(target_revision)
  shape
  revise "$1"
  wait_revision_after "$rev"
  rev=$(target_revision)
  wait_for "phase Pulling" 120 row_phase "$rev" Pulling
  # Killed once bytes are on disk, not after a fixed sleep: the pull writes its partial file in
  # 1 MiB steps (staged::CHUNK), so a kill before the first step leaves an empty file, which
  # nothing can resume from (on a loaded machine "Pulling" may be reported seconds before the
  # first byte arrives). At 2 Mbit/s the rest of the 3.8 MB artifact takes 10 s more.
  local agent_pod progress partial
  agent_pod=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}')
  kept() { find "$WORK/cache/tmp" -name '.kiln-partial-*' -size +0 | grep -q .; }
  wait_for "the first MiB of the pull on disk" 60 kept
  # Measured before the kill: the file only grows until then, so this is a floor of what the
  # killed agent keeps, and afterwards the restarted (unshaped) agent may already have resumed,
  # finished and moved the file into place.
  partial=$(find "$WORK/cache/tmp" -name '.kiln-partial-*' -printf '%s\n' | sort -n | tail -1)
  progress=$(kubectl -n "$NS" logs "$agent_pod" 2>/dev/null | grep '"message":"pulling"' | tail -1 |
    jq -r '.fields | "\(.bytes)/\(.total) bytes"')
  kill_component agent
  ((${partial:-0} > 0)) || { echo "   no partial download in the cache at the kill (the pull finished first?)" >&2; return 1; }
  unshape
  # The restarted agent resumes after the bytes the killed one kept (hashing them again, never
  # serving them unverified), and the partial file is gone once the whole is verified.
  local resumed_at=
  resumed() {
    local pod
    pod=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=agent \
      -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) || return 1
    [[ -n $pod && $pod != "$agent_pod" ]] || return 1
    resumed_at=$(kubectl -n "$NS" logs "$pod" 2>/dev/null |
      grep '"message":"resuming a pull from the bytes an earlier one kept"' | tail -1 | jq -r '.fields.bytes')
    [[ -n $resumed_at ]]
  }
  wait_for "the pull resumed after the kept bytes" 120 resumed
  ((resumed_at >= partial)) || { echo "   resumed at byte $resumed_at, below the $partial bytes kept" >&2; return 1; }
  NOTE="(killed at $progress, a $partial-byte partial file in the cache; the new agent resumed at byte $resumed_at)"
  empty_tmp() { [[ -z $(find "$WORK/cache/tmp" -name '.kiln-partial-*' 2>/dev/null) ]]; }
  wait_for "the partial file verified and moved into place" 120 empty_tmp
}
f_agent_warmup() {
  local rev
  rev=$(target_revision)
  revise "$1" 400
  wait_revision_after "$rev"
  rev=$(target_revision)
  wait_for "phase Warming" 120 row_phase "$rev" Warming
  # Not reported ready before it is warm: the row still serves the previous revision.
  [[ $(row | jq -r .revision) != "$rev" ]] || { echo "   revision $rev reported while warming: $(row)" >&2; return 1; }
  kill_component agent
  NOTE="(killed in Warming; the row served the previous revision meanwhile)"
}
f_registry_down() {
  local down_at=$SECONDS said=
  "$E2E_DIR/cluster" stop registry >/dev/null
  revise "$1"
  # Said on the target while it is down: nothing can be compiled, reused or rolled out.
  while ((SECONDS < down_at + 55)); do
    said=$(ct | jq -r '.status.conditions[]? | select(.type == "Reconciling" and .status == "True"
      and .reason == "StoreUnavailable") | .message')
    [[ -n $said ]] && break
    sleep 0.2
  done
  # And the node keeps serving what it verified.
  [[ $(row | jq -r .phase) == Ready ]] || { echo "   the node stopped serving: $(row)" >&2; return 1; }
  sleep $((60 - (SECONDS - down_at) > 0 ? 60 - (SECONDS - down_at) : 0))
  "$E2E_DIR/cluster" start registry >/dev/null || die "registry did not come back"
  [[ -n $said ]] || { echo "   the target did not say StoreUnavailable while the registry was down" >&2; return 1; }
  NOTE="(down $((SECONDS - down_at))s; Reconciling/StoreUnavailable: …${said: -90})"
}

f_apiserver_restart() {
  revise "$1"
  "$E2E_DIR/cluster" stop kube-apiserver >/dev/null
  sleep 10
  "$E2E_DIR/cluster" start kube-apiserver >/dev/null || die "apiserver did not come back"
}
f_class_change() {
  # The node's class labels change under it: kiln.dev/cpu-level (over the probe's level) now
  # names another CPU level. Readiness is withdrawn at once (the engine was proved for the old
  # class), a compile is scheduled for the new class; on this one machine the new label can only
  # be a lie, so that compile is refused where the hardware disagrees and the node stays not
  # ready (fail closed, no wrong-class artifact). When the label goes back the node returns to its
  # class's stored artifact with no new compile, verified, loaded and warmed again.
  local level other key jobs changed_at
  level=$(kubectl get kilnnode "$REAL" -o json | jq -r '.status.hardware.cpuLevel // empty')
  other=x86-64-v1
  [[ $level != "$other" ]] || other=x86-64-v2
  key=$KEY
  jobs=$(job_names "$key")
  changed_at=$(date -u +%s)
  kubectl label node "$REAL" kiln.dev/cpu-level="$other" --overwrite >/dev/null
  withdrawn() {
    [[ $(row | jq -r '"\(.phase) \(.class)"') == "Pending "*"$other"* && $(gate) == False ]] &&
      ! kubectl get node "$REAL" -o json | jq -e --arg l "$NS.ready.kiln.dev/$TARGET" '.metadata.labels[$l]'
  }
  wait_for "readiness withdrawn on the class change" 60 withdrawn
  new_class_job() {
    local k
    k=$(ct | jq -r --arg o "$other" '.status.classes[] | select(.class | contains($o)) | .compileKey') &&
      [[ -n $k ]] && (($(jobs_for "$k") > 0))
  }
  wait_for "a compile Job for the class at cpu-level $other" 60 new_class_job
  refused() {
    ct | jq -e --arg o "$other" '.status.classes[] | select(.class | contains($o))
      | .reason == "IncompatibleHardware" and (.message | contains("fix the labels"))'
  }
  wait_for "the $other compile refused as IncompatibleHardware" 120 refused
  [[ $(row | jq -r .phase) != Ready && $(gate) == False ]] ||
    { echo "   ready on a class whose compile was refused: $(row)" >&2; return 1; }
  kubectl label node "$REAL" kiln.dev/cpu-level- >/dev/null
  back() { converged && [[ $KEY == "$key" ]]; }
  wait_for "back on the first class" 120 back
  [[ -z $(comm -13 <(echo "$jobs") <(job_names "$key")) ]] ||
    { echo "   the first class was compiled again: $(comm -13 <(echo "$jobs") <(job_names "$key"))" >&2; return 1; }
  (($(date -d "$(row | jq -r .readySince)" +%s) >= changed_at)) ||
    { echo "   not warmed again: ready since $(row | jq -r .readySince)" >&2; return 1; }
  NOTE="(cpu-level $other: withdrawn, Job refused IncompatibleHardware, not ready; label removed: ${key:0:8}… re-warmed without a compile)"
}

f_artifact_corrupt() {
  # A fresh revision served, then its blob in the registry's storage damaged (odd trials: one
  # byte flipped; even: cut to half) and the node's cache emptied under a restarted agent: the
  # pull fails verification, the node fails closed (row Failed/HashMismatch, gate False). The
  # blob repaired and the agent restarted, it serves again (the trial's convergence check).
  revise "$1"
  wait_for "revision served" 240 converged
  local blob=$REGISTRY_DIR/docker/registry/v2/blobs/sha256/${DIGEST:0:2}/$DIGEST/data how
  [[ -f $blob ]] || die "no blob at $blob"
  cp "$blob" "$WORK/blob.orig"
  TRUNCATED=$blob
  if ((N % 2)); then
    how=flipped
    flip "$blob"
  else
    how=truncated
    truncate -s $(($(stat -c %s "$blob") / 2)) "$blob"
  fi
  find "$WORK/cache" -mindepth 1 -delete
  kill_component agent
  failed_closed() {
    [[ $(row | jq -r '"\(.phase) \(.reason)"') == "Failed HashMismatch" && $(gate) == False ]]
  }
  wait_for "fail closed on the $how blob" 120 failed_closed
  [[ -z $(find "$WORK/cache" -type f -size +1M) ]] || { echo "   a corrupt artifact is in the cache" >&2; return 1; }
  cp "$WORK/blob.orig" "$blob"
  TRUNCATED=
  kill_component agent
  NOTE="(blob $how: Failed/HashMismatch, gate False, nothing cached; repaired: served again)"
}

# --- engine faults: a second target on the node, the example target watched throughout ------
FAULTY=faulty
engine_sources() {
  # The example model with the marker as its doc_string (ModelProto field 6, appended), which
  # the ONNX Runtime compile keeps in the artifact; the 212-byte model with its constant at
  # 4 GiB; a fixture of x: f32[1, 16] for it (made from tests/data/mlp.onnx: the compile fails
  # before its values matter).
  local f
  for f in segfault abort spin; do
    python3 - "$REPO/examples/squeezenet/model.onnx" "$WORK/sources/fault-$f.onnx" "kiln-fault-inject:load:$f" <<'PY'
import sys
b = open(sys.argv[1], "rb").read()
doc = sys.argv[3].encode()
open(sys.argv[2], "wb").write(b + bytes([0x32, len(doc)]) + doc)
PY
  done
  python3 - "$REPO/node-agent/tests/data/huge.onnx" "$WORK/sources/huge-4g.onnx" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
old = struct.pack("<qq", 100000, 100000)
assert b.count(old) == 1
open(sys.argv[2], "wb").write(b.replace(old, struct.pack("<qq", 1024, 1 << 20)))
PY
  "$(bin kiln-agent)" fixtures --fixture-version v1 --shape x=1,16 --model "$REPO/node-agent/tests/data/mlp.onnx" \
    --out "$WORK/sources/huge-fixture.safetensors" >/dev/null || die "fixture for the 4 GiB model"
  chmod 644 "$WORK/sources/"*
}
# faulty_model FILE: the ModelArtifact "faulty" of a source in the sources directory.
faulty_model() {
  local file=$1 sha size
  sha=$(sha256sum "$WORK/sources/$file" | cut -d' ' -f1)
  size=$(stat -c %s "$WORK/sources/$file")
  if [[ $file == huge-4g.onnx ]]; then
    cat <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: $FAULTY}
spec:
  source: {uri: "file://$file", sha256: "$sha", size: $size}
  format: onnx
  inputs:
    - {name: x, dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 16}]}
  fixtures:
    - {version: v1, uri: "file://huge-fixture.safetensors", sha256: "$(sha256sum "$WORK/sources/huge-fixture.safetensors" | cut -d' ' -f1)"}
YAML
  else
    python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d["kind"] == "ModelArtifact":
        d["metadata"] = {"name": sys.argv[2]}
        d["spec"]["source"].update(uri="file://" + sys.argv[3], sha256=sys.argv[4], size=int(sys.argv[5]))
        print(yaml.safe_dump(d))' "$REPO/examples/squeezenet/kiln.yaml" "$FAULTY" "$file" "$sha" "$size"
  fi
}
# faulty_target PROFILE [COMPILE]: the CompiledTarget "faulty" on ONNX Runtime, one warmup run.
faulty_target() {
  cat <<YAML
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $FAULTY}
spec:
  modelRef: {name: $FAULTY}
  backend: {kind: onnxruntime}
  profiles: [{name: $1, dims: {batch: 1}}]
  warmup: {iterations: 1, fixtureVersion: v1}
${2:+  compile: $2}
YAML
}
faulty_row() { kubectl get kilnnode "$REAL" -o json 2>/dev/null | jq -c --arg ns "$NS" --arg t "$FAULTY" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
# engine_fault FAULT REASON NEEDLE WHERE: applies the faulty target and waits (up to 300 s) for
# its row (WHERE=row) or class (WHERE=class) to fail with REASON and a message containing NEEDLE,
# looking at the example target every 0.2 s: it must stay Ready with its gate True, and the agent
# process must be the same one at the end.
engine_fault() {
  local fault=$1 reason=$2 needle=$3 where=$4 file pid said= bad=0 looks=0 end
  file=fault-$fault.onnx
  [[ $fault != memory ]] || file=huge-4g.onnx
  pid=$(pid_of '/bin/kiln-agent run') || die "no agent process"
  faulty_model "$file" | kubectl -n "$NS" apply -f - >/dev/null
  if [[ $fault == memory ]]; then
    faulty_target "p$N" "{resources: {limits: {memory: 2Gi}, requests: {memory: 256Mi}}}"
  else
    faulty_target "p$N"
  fi | kubectl -n "$NS" apply -f - >/dev/null
  end=$((SECONDS + 300))
  while ((SECONDS < end)); do
    looks=$((looks + 1))
    converged || { bad=$((bad + 1)); echo "   the example target was not Ready: $(row)" >&2; }
    if [[ $where == row ]]; then
      said=$(faulty_row | jq -r --arg r "$reason" 'select(.phase == "Failed" and .reason == $r) | .message // empty')
    else
      said=$(kubectl -n "$NS" get compiledtarget "$FAULTY" -o json |
        jq -r --arg r "$reason" '.status.classes[]? | select(.reason == $r) | .message // empty')
    fi
    [[ -n $said ]] && break
    sleep 0.2
  done
  kubectl -n "$NS" delete compiledtarget "$FAULTY" --wait=true --timeout=60s >/dev/null || true
  kubectl -n "$NS" delete modelartifact "$FAULTY" --wait=true --timeout=60s >/dev/null || true
  [[ -n $said ]] || { echo "   $FAULTY never failed $reason: $(faulty_row)" >&2; return 1; }
  [[ $said == *"$needle"* ]] || { echo "   $reason without \"$needle\": $said" >&2; return 1; }
  ((bad == 0)) || { echo "   the example target was not Ready at $bad of $looks looks" >&2; return 1; }
  [[ $(pid_of '/bin/kiln-agent run') == "$pid" ]] || { echo "   the agent process changed" >&2; return 1; }
  NOTE="($reason: …${said: -90}; example target Ready at all $looks looks, agent pid $pid)"
}
f_engine_segfault() { engine_fault segfault EngineCrashed "signal SIGSEGV (11)" row; }
f_engine_abort() { engine_fault abort EngineCrashed "signal SIGABRT (6)" row; }
f_engine_spin() { engine_fault spin Timeout "process group was killed" row; }
f_engine_memory() { engine_fault memory MemoryBudgetExceeded "RLIMIT_DATA" class; }

# f_csi_plugin NAME: a pod with the model volume, the plugin killed just before it is created
# (odd trials) or just after.
f_csi_plugin() {
  revise "$1"
  local pod=model-$1 old at_kill
  old=$(kubectl -n "$NS" get pod -l app.kubernetes.io/component=csi -o jsonpath='{.items[0].metadata.name}')
  if ((N % 2)); then
    kill -KILL "$(pid_of '/bin/kiln-csi')" || { echo "   no plugin process" >&2; return 1; }
  fi
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $pod}
spec:
  nodeName: $REAL
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - {name: c, image: $BUSYBOX_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"], volumeMounts: [{name: model, mountPath: /model, readOnly: true}]}
  volumes: [{name: model, csi: {driver: csi.kiln.dev, readOnly: true, volumeAttributes: {target: $TARGET}}}]
YAML
  if ((N % 2 == 0)); then
    kill -KILL "$(pid_of '/bin/kiln-csi')" || { echo "   no plugin process" >&2; return 1; }
  fi
  at_kill=$(if grep -q "kubernetes.io~csi/model/mount" /proc/self/mountinfo; then echo mounted
    elif [[ -n $(ls -A "$WORK/cache/published" 2>/dev/null) ]]; then echo "building the volume"; else echo "before the publish"; fi)
  kubectl -n "$NS" delete pod "$old" --wait=false >/dev/null
  plugin_back() {
    kubectl -n "$NS" get pod -l app.kubernetes.io/component=csi -o json |
      jq -e --arg old "$old" '[.items[] | select(.metadata.name != $old and .status.phase == "Running")] | length == 1' &&
      kubectl get csinode "$REAL" -o json | jq -e '.spec.drivers // [] | any(.name == "csi.kiln.dev")'
  }
  wait_for "the plugin back and registered" 120 plugin_back
  running() { [[ $(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.phase}') == Running ]]; }
  wait_for "pod $pod mounted and Running" 120 running
  local sum named
  sum=$(kubectl -n "$NS" exec "$pod" -- sha256sum /model/artifact | cut -d' ' -f1)
  named=$(kubectl -n "$NS" exec "$pod" -- cat /model/kiln.json | jq -r .digest)
  [[ -n $sum && $sum == "$named" ]] || { echo "   /model/artifact hashes to $sum, kiln.json names $named" >&2; return 1; }
  kubectl -n "$NS" delete pod "$pod" --wait=true --timeout=60s >/dev/null
  left() { [[ -z $(ls -A "$WORK/cache/published" 2>/dev/null) ]] && ! grep -q "kubernetes.io~csi/model/mount" /proc/self/mountinfo; }
  wait_for "nothing mounted or published after the pod" 60 left
  NOTE="(killed $at_kill; mounted ${sum:0:12}… as kiln.json names it, nothing left after the pod)"
}

f_serving_pod() {
  revise "$1" 400
  local pod=oip-$1 image r p st rc at_kill seen=() uid pid end t0 rechecked=0
  image=$(kubectl -n "$NS" get ds kiln-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $pod
  annotations: {kiln.dev/target: $TARGET, kiln.dev/protocol: oip-v2, kiln.dev/port: "8000"}
spec:
  readinessGates: [{conditionType: kiln.dev/warm}]
  nodeName: $REAL
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: server
      image: $image
      imagePullPolicy: Never
      args: [serve, --model-dir, /model, --port, "8000"]
      readinessProbe: {httpGet: {path: /v2/health/ready, port: 8000}, periodSeconds: 1}
      volumeMounts: [{name: model, mountPath: /model, readOnly: true}]
  volumes: [{name: model, csi: {driver: csi.kiln.dev, readOnly: true, volumeAttributes: {target: $TARGET}}}]
YAML
  warm_reason() { kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].reason}/{.status.conditions[?(@.type=="kiln.dev/warm")].status}'; }
  end=$((SECONDS + 300))
  until r=$(warm_reason) && [[ $r == WarmingServer/* || $r == */True ]]; do
    ((SECONDS < end)) || { echo "   $pod: neither warming through its server nor warm in 300 s (gate $r)" >&2; return 1; }
    sleep 0.1
  done
  uid=$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.metadata.uid}')
  pid=$(pgrep -f "kiln-agent serve --model-dir /model --port 8000" | while read -r q; do
    grep -q "$uid" "/proc/$q/cgroup" 2>/dev/null && echo "$q"; done | head -1)
  [[ -n $pid ]] || { echo "   no server process of $pod (gate $r)" >&2; return 1; }
  kill -KILL "$pid"
  at_kill=${r%/*}
  t0=$SECONDS
  end=$((SECONDS + 180))
  while ((SECONDS < end)); do
    p=$(kubectl -n "$NS" get pod "$pod" -o json)
    st=$(jq -r '.status.conditions[]? | select(.type == "kiln.dev/warm") | .status' <<<"$p")
    r=$(jq -r '.status.conditions[]? | select(.type == "kiln.dev/warm") | .reason' <<<"$p")
    rc=$(jq '[.status.containerStatuses[]?.restartCount] | add // 0' <<<"$p")
    [[ -n $r && " ${seen[*]} " != *" $r "* ]] && seen+=("$r")
    if ((rc == 0)); then
      # Before the kubelet counts the restart, only a server that passed before the kill may
      # still show True; one killed while warming must not.
      [[ $st != True || $at_kill == Ready ]] || { echo "   $pod: gate True after its server was killed mid-warming, no restart counted" >&2; return 1; }
    elif [[ $st == True ]]; then
      # The restarted server was seen waiting or warming before it was True again.
      ((rechecked)) || { echo "   $pod: True after the restart without a new check (reasons: ${seen[*]})" >&2; return 1; }
      break
    elif [[ $r == WarmingServer || $r == WaitingForServer ]]; then
      rechecked=1
    fi
    sleep 0.2
  done
  [[ $st == True ]] || { echo "   $pod: not warm again after the restart (reasons: ${seen[*]})" >&2; return 1; }
  kubectl -n "$NS" delete pod "$pod" --wait=false >/dev/null
  NOTE="(killed while ${at_kill}; then ${seen[*]}; True again $((SECONDS - t0)) s later, restart counted)"
}

# run_case NAME FN [JOBS] [VARIANTS]: the case's trials, KILN_E2E_FAULT_TRIALS or one per variant.
run_case() {
  local name=$1 fn=$2 jobs=${3:-} trials=${TRIALS:-${4:-1}} i
  [[ " ${KILN_E2E_FAULT_CASES:-$name} " == *" $name "* ]] || return 0
  for ((i = 0; i < trials; i++)); do EXPECT_JOBS=$jobs trial "$name" "$fn"; done
}

if [[ -n $TRIALS ]]; then echo "== fault table ($TRIALS trials each)"
else echo "== fault table (1 trial each; artifact-corrupt and csi-plugin 2, one per variant)"; fi
run_case operator-reconcile f_operator_reconcile 1
run_case operator-compile f_operator_compile 1
run_case agent-download f_agent_download 1
run_case agent-warmup f_agent_warmup 1
run_case registry-down f_registry_down
run_case apiserver-restart f_apiserver_restart 1
run_case class-change f_class_change
run_case artifact-corrupt f_artifact_corrupt 1 2
run_case csi-plugin f_csi_plugin 1 2
run_case serving-pod f_serving_pod 1
if engine_cases_wanted; then
  engine_sources
  run_case engine-segfault f_engine_segfault
  run_case engine-abort f_engine_abort
  run_case engine-spin f_engine_spin
  run_case engine-memory f_engine_memory
fi
# Watches survived every fault: a plain change still converges promptly.
revise after-faults
wait_for "a change after the faults" 120 converged

echo "== fault table: case, trials, survived, lost"
printf '%s\n' "${RESULTS[@]}" | awk '{t[$1]++; s[$1] += $2; l[$1] += $3; if (!($1 in o)) {o[$1] = ++n; name[n] = $1}}
  END {for (i = 1; i <= n; i++) printf "   %-20s %d trials, %d survived, %d lost\n", name[i], t[name[i]], s[name[i]], l[name[i]]}'
((FAILED == 0)) || die "a fault was not survived or lost data (see above)"
echo "faults passed"
