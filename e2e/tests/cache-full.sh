#!/usr/bin/env bash
# A full node cache on the real cluster: kiln installed by its chart with the store on the
# cluster's registry and the agent's node cache on a small filesystem (a tmpfs mounted with
# size= on the cache directory before the install, shrunk by `mount -o remount,size=` to leave
# half of a one-profile tract artifact free once the real artifact sizes are measured in the
# cache; unmounted at the end). Target A is Ready on revision 1 (tract), then on revision 2
# (onnxruntime); revision 1's artifact stays in the cache as known-good history.
#   1. C (tract, two profiles: about twice the size of A's revision 1) does not fit, nor would it
#      with revision 1 evicted: its KilnNode row is Failed InsufficientStorage, the message names
#      the bytes needed (C's size in the registry) and free (the tmpfs's free bytes) and says
#      evicting would not free enough; nothing was evicted for it, nothing of it is in tmp/
#      (no .kiln-partial-*, no pull directory) or artifacts/, the free space is what it was.
#   2. B (tract, one profile) does not fit the free space but does once revision 1's artifact is
#      evicted: the agent logs "node cache full; evicted" naming it, B is Ready, A's revision 2
#      (what serves) is still cached.
#   3. D (tract, one profile) does not fit and everything cached serves: Failed
#      InsufficientStorage, "would not free enough", nothing evicted or left behind.
# Throughout, the targets already Ready stay Ready: each window is watched from its start
# (ready_never_false on the CompiledTarget) and their KilnNode rows are unchanged.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
source "$(dirname "$0")/observe-lib.sh"
kiln_test cache-full
CACHE=$WORK/cache
CTS=/apis/kiln.dev/v1alpha1/namespaces/$NS/compiledtargets
WATCH_A=
teardown() {
  watch_stop
  [[ -z $WATCH_A ]] || kill "$WATCH_A" 2>/dev/null || true
  # The agent's and the CSI plugin's pods mount the tmpfs (hostPath): they go before it does.
  kubectl -n "$NS" delete compiledtarget --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  helm uninstall "$REL" -n "$NS" --wait --timeout 120s >/dev/null 2>&1 || true
  if mountpoint -q "$CACHE"; then umount "$CACHE" 2>/dev/null || umount -l "$CACHE" || true; fi
}

kiln_images "$WORK"
kiln_example_dirs "$WORK"
# Room enough for everything at first; shrunk below once the artifacts' real sizes are known.
mount -t tmpfs -o size=64m,mode=755 kiln-e2e-cache-full "$CACHE" || die "cannot mount a tmpfs on $CACHE"
kiln_fresh_crds
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" || die "kiln did not come up"

# target NAME KIND PROFILE...: a CompiledTarget of the example, one profile per name (batch 1,
# 2, ...; every profile adds its own compiled model to a tract artifact).
target() {
  local name=$1 kind=$2 profiles='' p b=1
  shift 2
  for p in "$@"; do profiles+="{name: $p, dims: {batch: $b}}, "; b=$((b + 1)); done
  kubectl -n "$NS" apply -f - >/dev/null <<YAML || die "apply $name"
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $name}
spec:
  modelRef: {name: squeezenet}
  backend: {kind: $kind}
  profiles: [${profiles%, }]
  warmup: {iterations: 5, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}
YAML
}
ct() { kubectl -n "$NS" get compiledtarget "$1" -o json; }
row() { kubectl get kilnnode "$REAL" -o json | jq -cS --arg ns "$NS" --arg t "$1" '.status.targets[]? | select(.namespace == $ns and .name == $t)'; }
rowq() { local t=$1; shift; row "$t" | jq -e "$@" >/dev/null; }
# settled TARGET REVISION SECS: waits for TARGET's row on REVISION to be Ready, failing at once
# when it is Failed instead.
settled() {
  # shellcheck disable=SC2016 # $n is jq's
  wait_for "$1 Ready on revision $2" "$3" rowq "$1" --argjson n "$2" '.revision == $n and (.phase == "Ready" or .phase == "Failed")'
  rowq "$1" '.phase == "Ready"' || die "$1 failed: $(row "$1")"
}
# digest_of TARGET REVISION: the artifact digest (hex) of that revision, from the target's status.
digest_of() { ct "$1" | jq -r --argjson n "$2" '.status.revisions[] | select(.number == $n) | .artifacts[0].digest | sub("^sha256:"; "")'; }
# stored_size TARGET: bytes of the target's artifact as the registry holds it (its layer's size).
stored_size() {
  local m
  m=$(ct "$1" | jq -r '.status.classes[0].manifestDigest')
  curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REGISTRY_ADDR/v2/$REPOSITORY/manifests/$m" | jq -er '.layers[0].size'
}
free_bytes() { stat -f -c '%a * %S' "$CACHE" | bc; }
cached() { [[ -f $CACHE/artifacts/$1/artifact ]]; }
cached_list() { find "$CACHE/artifacts" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | paste -sd' '; }
# evictions: the agent's "node cache full; ..." log lines, as JSON fields: "evicted ..." with the
# digests it deleted, or "nothing that may go would make the room".
evictions() {
  kubectl -n "$NS" logs ds/kiln-agent --tail=-1 |
    jq -cR 'fromjson? | objects | (.fields // .) | select((.message // "") | startswith("node cache full; "))'
}
eviction_for() { evictions | jq -ce --arg d "$1" 'select(.digest == $d)' | tail -1; }
# no_leftovers DIGEST: nothing of it in tmp/ (no partial file, no pull directory) or artifacts/.
no_leftovers() {
  [[ -z $(find "$CACHE/tmp" -name '.kiln-partial-*' -print -quit) && ! -e $CACHE/tmp/pull-$1 && ! -e $CACHE/artifacts/$1 ]]
}
# insufficient TARGET FREE: checks TARGET's row, Failed InsufficientStorage with a message that
# names its stored size as needed and FREE (the tmpfs's free bytes) as free, and says evicting
# would not free enough; that nothing of it is left in the cache and the free space is FREE
# still. Sets NEEDED.
insufficient() {
  local t=$1 free=$2 msg digest
  wait_for "$t Failed on $REAL" 240 rowq "$t" '.phase == "Failed"'
  rowq "$t" '.reason == "InsufficientStorage"' || die "$t failed for another reason: $(row "$t")"
  msg=$(row "$t" | jq -r .message)
  digest=$(row "$t" | jq -r '.artifactDigest | sub("^sha256:"; "")')
  [[ $msg =~ needs\ ([0-9]+)\ more\ bytes,\ ([0-9]+)\ free ]] || die "$t's message names no bytes needed and free: $msg"
  NEEDED=${BASH_REMATCH[1]}
  local said_free=${BASH_REMATCH[2]} stored
  stored=$(stored_size "$t") || die "no stored size for $t"
  ((NEEDED == stored)) || die "$t's message says it needs $NEEDED bytes; the registry's artifact has $stored"
  ((said_free == free)) || die "$t's message says $said_free bytes free; the tmpfs has $free"
  [[ $msg == *"would not free enough"* ]] || die "$t's message does not say that evicting would not free enough: $msg"
  wait_for "nothing of $t ($digest) in the cache's tmp/ or artifacts/" 10 no_leftovers "$digest"
  [[ $(free_bytes) == "$free" ]] || die "the failed pull of $t left $((free - $(free_bytes))) bytes taken"
  wait_for "the agent's eviction attempt for $t in its log" 30 eviction_for "$digest"
  [[ $(eviction_for "$digest" | jq -r .message) == *"nothing that may go would make the room" ]] ||
    die "the agent evicted for $t, which could not fit: $(eviction_for "$digest")"
  echo "   $t: $(row "$t" | jq -c '{phase, reason}') $msg"
}

echo "== A Ready on revision 1 (tract), then on revision 2 (onnxruntime)"
t0=$SECONDS
awk '/^---/ {exit} {print}' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null || die "apply the ModelArtifact"
target a tract a
settled a 1 300
target a onnxruntime a
settled a 2 300
wait_for "revision 2 known-good" 60 bash -c "kubectl -n $NS get compiledtarget a -o json | jq -e '[.status.revisions[] | select(.knownGood) | .number] == [1, 2] and .status.revision == 2'"
D1=$(digest_of a 1) D2=$(digest_of a 2)
cached "$D1" || die "revision 1's artifact $D1 is not in the node cache as history: $(cached_list)"
cached "$D2" || die "revision 2's artifact $D2 is not in the node cache"
echo "   $((SECONDS - t0)) s; cached: revision 1 ${D1:0:12} (history), revision 2 ${D2:0:12} (serves)"

echo "== the cache's tmpfs shrunk to leave half of revision 1's artifact free"
# tmpfs counts whole pages: a file of N bytes takes ceil(N / page) of them, and its size= is
# rounded up to pages. What the cache holds now (both artifacts, their manifests, the fixture,
# the index) stays; half a tract artifact is left free, so a one-profile tract artifact (the
# same bytes but for its profile's name) fits only once revision 1's artifact is evicted, and a
# two-profile one (twice that) not even then.
PAGE=$(getconf PAGESIZE)
A1=$(stat -c %s "$CACHE/artifacts/$D1/artifact")
read -r blocks avail < <(stat -f -c '%b %a' "$CACHE")
HALF=$(((A1 + PAGE - 1) / PAGE / 2))
mount -o remount,size=$(((blocks - avail + HALF) * PAGE)) "$CACHE" || die "cannot shrink the tmpfs on $CACHE"
FREE=$(free_bytes)
echo "   revision 1's artifact $A1 bytes, revision 2's $(stat -c %s "$CACHE/artifacts/$D2/artifact"); tmpfs $(($(stat -f -c %b "$CACHE") * PAGE)) bytes, $FREE free"
((FREE < A1)) || die "the shrunk tmpfs still has $FREE bytes free, room for $A1"

echo "== 1. C (two profiles) does not fit, even with revision 1 evicted"
kubectl -n "$NS" wait --for=condition=Ready compiledtarget/a --timeout=60s >/dev/null || die "A's target not Ready"
ROW_A=$(row a)
watch_object "$WORK/watch-a.jsonl" "$CTS" a
t0=$SECONDS
target c tract c1 c2
insufficient c "$FREE"
((NEEDED > FREE + A1)) || die "sizing: C needs $NEEDED bytes, which evicting revision 1 ($A1) would have made room for ($FREE free)"
cached "$D1" || die "revision 1's artifact was evicted though that could not make room for C"
ready_never_false "$WORK/watch-a.jsonl" "$CTS" a
[[ $(row a) == "$ROW_A" ]] || die "A's row changed: $ROW_A -> $(row a)"
echo "   $((SECONDS - t0)) s; revision 1 still cached, A's row unchanged"
kubectl -n "$NS" delete compiledtarget c --wait=true --timeout=60s >/dev/null || die "delete C"
wait_for "C's row gone" 60 bash -c "[[ -z \$(kubectl get kilnnode $REAL -o json | jq -c --arg ns $NS '.status.targets[]? | select(.namespace == \$ns and .name == \"c\")') ]]"

echo "== 2. B fits once revision 1's artifact (history, not serving) is evicted"
FREE=$(free_bytes)
watch_object "$WORK/watch-a.jsonl" "$CTS" a
t0=$SECONDS
target b tract b
settled b 1 240
DB=$(row b | jq -r '.artifactDigest | sub("^sha256:"; "")')
NB=$(stored_size b) || die "no stored size for B"
((NB > FREE)) || die "sizing: B's $NB bytes fit the $FREE free without an eviction"
wait_for "the agent's eviction for B in its log" 30 eviction_for "$DB"
EVICTION=$(eviction_for "$DB")
jq -e --arg d "$D1" '.evicted | contains($d)' <<<"$EVICTION" >/dev/null || die "B's eviction did not take revision 1's artifact: $EVICTION"
cached "$D1" && die "revision 1's artifact $D1 is still cached"
cached "$D2" || die "A's revision 2 ($D2), which serves, was evicted"
cached "$DB" || die "B's artifact is not in the cache"
jq -e --arg d "$D1" '[.targets[][] | select(.digest == $d)] | length == 0' "$CACHE/index.json" >/dev/null ||
  die "the cache index still lists the evicted artifact: $(cat "$CACHE/index.json")"
ready_never_false "$WORK/watch-a.jsonl" "$CTS" a
[[ $(row a) == "$ROW_A" ]] || die "A's row changed: $ROW_A -> $(row a)"
echo "   $((SECONDS - t0)) s; B ($NB bytes, $FREE free) Ready after the agent logged: $(jq -c '{message, needed, evicted}' <<<"$EVICTION")"
echo "   cached now: $(cached_list) (A's revision 2 and B: what serves)"

echo "== 3. D does not fit and everything cached serves"
kubectl -n "$NS" wait --for=condition=Ready compiledtarget/b --timeout=60s >/dev/null || die "B's target not Ready"
FREE=$(free_bytes)
ROW_B=$(row b)
# Two windows at once: A's watch is set aside (observe-lib watches one at a time) while B's runs.
watch_object "$WORK/watch-a.jsonl" "$CTS" a
WATCH_A=$WATCH_PID WATCH_PID=
watch_object "$WORK/watch-b.jsonl" "$CTS" b
t0=$SECONDS
target d tract d
insufficient d "$FREE"
[[ $(cached_list) == "$(printf '%s\n' "$D2" "$DB" | sort | paste -sd' ')" ]] ||
  die "the cache should hold exactly what serves (A's revision 2 $D2, B's $DB): $(cached_list)"
ready_never_false "$WORK/watch-b.jsonl" "$CTS" b
WATCH_PID=$WATCH_A WATCH_A=
ready_never_false "$WORK/watch-a.jsonl" "$CTS" a
[[ $(row a) == "$ROW_A" ]] || die "A's row changed: $ROW_A -> $(row a)"
[[ $(row b) == "$ROW_B" ]] || die "B's row changed: $ROW_B -> $(row b)"
echo "   $((SECONDS - t0)) s; A's and B's rows unchanged"
echo "cache-full passed"
