#!/usr/bin/env bash
# A fleet pulling through a registry mirror (set-up in operator-lib.sh). An origin registry
# (Debian's docker-registry, access log on) holds the store; in front of it a real pull-through
# cache (Distribution 3 in proxy mode, scripts/ensure/distribution.sh), both processes on the
# node's address. kiln-operator runs with `--registry-mirrors` naming the cache, as the chart's
# store.mirrors sets it: the compile Job on the real node gets the mirrors, pushes to the origin
# and preheats the cache. Then 100 fake nodes of the real node's class, each with a real
# `kiln-agent run` (its ServiceAccount's token, its own cache, started in waves of 10), pull,
# verify, load and warm the artifact through the mirror until their rows are Ready.
# Asserts: the Job's environment carries the mirrors and its log the preheat; every agent Ready at
# the artifact's digest, the mirror never passed over for it; the origin's access log shows the
# artifact layer fetched once in all (by the preheat) and no blob fetched by the fleet. Prints the
# origin's blob bytes for N = 1, 10 and 100 against N times the artifact without the mirror.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/observe-lib.sh"
source "$(dirname "$0")/operator-lib.sh"

WAVE=10
FLEET_SIZE=${KILN_E2E_MIRROR_FLEET:-100}
FAKES=()
for ((i = 0; i < FLEET_SIZE; i++)); do FAKES+=("mirror-$i-$NS"); done
# shellcheck disable=SC2034 # read by cleanup (operator-lib.sh)
CLEANUP_NODES=("${FAKES[@]}")
AGENT_PIDS=()
SERVER_PIDS=()
stop_all() {
  local p
  for p in "${AGENT_PIDS[@]}" "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # Cluster-scoped, so a later `helm install kiln` (the README's, in the kiln test) could not own them.
  kubectl delete clusterrolebinding/kiln-agent clusterrole/kiln-agent --ignore-not-found >/dev/null 2>&1 || true
  cleanup
}
trap stop_all EXIT
show_logs() {
  tail -n 20 "$WORK"/operator-mirror.log "$WORK"/cache.log >&2 || true
  for f in "$WORK"/agent-*.log; do [[ -f $f ]] && { echo "-- $f"; tail -n 8 "$f"; } >&2; done
  dump "$NS" >&2
}

# Both registries run in the node's network namespace, as the cluster's own registry does, so
# they listen on the node's address: pods reach them there, host processes through its route.
in_node() { nsenter --net="/run/netns/$NETNS" "$@"; }
# free_port: a TCP port nothing listens on now on the node's address.
free_port() { in_node python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$NODE_IP"; }
# serve NAME BINARY CONFIG: a registry, its log in $WORK/NAME.log (nsenter execs it, so the PID
# kept is the registry's).
serve() {
  nsenter --net="/run/netns/$NETNS" "$2" serve "$3" >"$WORK/$1.log" 2>&1 &
  SERVER_PIDS+=($!)
}
registry_config() { # DIR ADDR ACCESS-LOG-DISABLED [EXTRA]
  cat <<YAML
version: 0.1
log: {level: warn, accesslog: {disabled: $3}}
storage: {filesystem: {rootdirectory: $1}, delete: {enabled: true}}
http: {addr: "$2", secret: kiln-e2e-mirror}
${4:-}
YAML
}

echo "== origin (docker-registry, access log) and pull-through cache (Distribution 3)"
dist=$("$REPO/scripts/ensure/distribution.sh") || die "no Distribution 3 registry (scripts/ensure/distribution.sh)"
ORIGIN=$NODE_IP:$(free_port)
CACHE=$NODE_IP:$(free_port)
registry_config "$WORK/origin" "$ORIGIN" false >"$WORK/origin.yml"
serve origin /usr/bin/docker-registry "$WORK/origin.yml"
wait_for "origin registry" 30 curl -fsS "http://$ORIGIN/v2/"
registry_config "$WORK/cache" "$CACHE" true "proxy: {remoteurl: \"http://$ORIGIN\"}" >"$WORK/cache.yml"
serve cache "$dist" "$WORK/cache.yml"
wait_for "cache registry" 30 curl -fsS "http://$CACHE/v2/"
MIRRORS="[{\"host\": \"http://$CACHE\", \"capabilities\": [\"pull\", \"resolve\"]}]"
STORE_REPO=kiln-$NS
echo "   origin $ORIGIN, cache $CACHE ($("$dist" --version))"

# Blob GETs the origin served (200/206), from its access log: "DIGEST BYTES USER-AGENT" a line.
origin_blob_gets() {
  awk -F'"' '$2 ~ /^GET \/v2\/.*\/blobs\/sha256:/ {
    split($3, s, " "); if (s[1] != 200 && s[1] != 206) next
    split($2, r, " "); split(r[2], p, "/blobs/"); print p[2], s[2], $6 }' "$WORK/origin.log"
}

report_hardware "$REAL"
KUBECONFIG=$WORK/kubeconfig "$OPERATOR" --store "oci://$ORIGIN/$STORE_REPO" --registry-insecure \
  --registry-mirrors "$MIRRORS" --agent-image kiln-e2e/agent:test --agent-image-pull-policy Never \
  --sources-host-path "$WORK/sources" --listen 127.0.0.1:18093 --no-leader-election \
  --retry-backoff-seconds 2 >>"$WORK/operator-mirror.log" 2>&1 &
OP_PIDS+=($!)
wait_for "operator /readyz" 60 curl -fsS http://127.0.0.1:18093/readyz

sed '/^---$/q' "$REPO/examples/squeezenet/kiln.yaml" | kubectl -n "$NS" apply -f - >/dev/null

echo "== the compile Job on the real node pushes to the origin and preheats the cache"
target seed "kubernetes.io/hostname: $REAL"
wait_for "seed compiled" 240 cond_is seed Compiled True Compiled
job=$(kubectl -n "$NS" get jobs -o json | jq -c '.items[0]')
jq -e --arg m "$MIRRORS" '.spec.template.spec.containers[0].env[] | select(.name == "KILN_REGISTRY_MIRRORS") | .value == $m' \
  <<<"$job" >/dev/null || die "the Job's KILN_REGISTRY_MIRRORS is not $MIRRORS"
pod=$(kubectl -n "$NS" get pods -l job-name="$(jq -r .metadata.name <<<"$job")" -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$NS" logs "$pod" >"$WORK/job.log" 2>&1 || true
grep -q "registry mirror preheated.*$CACHE" "$WORK/job.log" || die "the Job did not preheat $CACHE: $(tail -5 "$WORK/job.log")"
DIGEST=$(kubectl -n "$NS" get compiledtarget seed -o jsonpath='{.status.classes[0].artifactDigest}')
MDIGEST=$(kubectl -n "$NS" get compiledtarget seed -o jsonpath='{.status.classes[0].manifestDigest}')
SIZE=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
  "http://$ORIGIN/v2/$STORE_REPO/manifests/$MDIGEST" | jq -r .layers[0].size)
BEFORE=$(origin_blob_gets | wc -l)
layer_gets() { origin_blob_gets | awk -v d="sha256:$DIGEST" '$1 == d' | wc -l; }
# What the origin served since the preheat that a node's pull caused: the layer to anyone, or
# any blob to the cache (Go's user agent; kiln's clients say oci-client). The operator's own
# lookups read the build manifest from the origin, mirrors being for pulls.
fleet_gets() {
  origin_blob_gets | tail -n +$((BEFORE + 1)) | awk -v d="sha256:$DIGEST" '$1 == d || / Go-http-client\//'
}
(($(layer_gets) == 1)) || die "origin served the layer $(layer_gets) times before any node pulled, want 1 (the preheat): $(origin_blob_gets)"
echo "   artifact sha256:${DIGEST:0:16}… ($SIZE bytes), fetched once from the origin, by the preheat"

echo "== $FLEET_SIZE fake nodes of the class, each with its own kiln-agent, in waves of $WAVE"
helm template kiln "$REPO/charts/kiln" -n kiln-system --set store.url=/unused \
  --show-only templates/agent-rbac.yaml | kubectl apply -f - >/dev/null
mkdir -p "$WORK/agent-sa"
sa_kubeconfig kiln-system kiln-agent "$WORK/agent-sa"
AGENT=$(bin kiln-agent)
fake_nodes "${FAKES[@]}"
target fleet "kiln-e2e/pool: $NS"
wait_for "fleet compiled (the seed's key, no Job)" 60 cond_is fleet Compiled True Compiled
row_ready() {
  kubectl get kilnnode "$1" -o json | jq -e --arg ns "$NS" --arg d "$DIGEST" \
    '.status.targets[]? | select(.namespace == $ns and .name == "fleet") | .phase == "Ready" and (.artifactDigest | endswith($d))'
}
start_agent() { # INDEX
  mkdir -p "$WORK/cache-$1"
  KUBECONFIG=$WORK/agent-sa/kubeconfig NODE_NAME=${FAKES[$1]} "$AGENT" run --cache "$WORK/cache-$1" \
    --store "oci://$ORIGIN/$STORE_REPO" --registry-insecure --registry-mirrors "$MIRRORS" \
    --source-base "$WORK/sources" --listen "127.0.0.1:$((18200 + $1))" --retry-seconds 5 --resync-seconds 5 \
    >"$WORK/agent-$1.log" 2>&1 &
  AGENT_PIDS+=($!)
}
figures=()
started=0
for wave in 1 $((WAVE - 1)) $(for ((w = WAVE; w < FLEET_SIZE; w += WAVE)); do echo $WAVE; done); do
  first=$started
  for ((i = first; i < first + wave && i < FLEET_SIZE; i++)); do start_agent "$i"; done
  started=$i
  for ((i = first; i < started; i++)); do wait_for "${FAKES[$i]} Ready" 120 row_ready "${FAKES[$i]}"; done
  # Passed over for this artifact: the log names the manifest (the counter would also count
  # targets other tests left selecting every node, whose manifests this origin lacks).
  for ((i = first; i < started; i++)); do
    ! grep 'mirror passed over' "$WORK/agent-$i.log" | grep -qF "$MDIGEST" ||
      die "agent $i passed over the mirror for $MDIGEST: $(grep -m3 'mirror passed over' "$WORK/agent-$i.log")"
  done
  kill -TERM "${AGENT_PIDS[@]}" 2>/dev/null || true
  wait "${AGENT_PIDS[@]}" 2>/dev/null || true
  AGENT_PIDS=()
  if ((started == 1 || started == WAVE || started == FLEET_SIZE)); then
    figures+=("$started $(fleet_gets | awk '{s += $2} END {print s + 0}')")
  fi
done
((started == FLEET_SIZE)) || die "started $started agents, want $FLEET_SIZE"

echo "== the origin served no blob to the fleet: each blob came from the cache"
(($(layer_gets) == 1)) || die "the layer was fetched $(layer_gets) times from the origin, want 1: $(origin_blob_gets)"
[[ -z $(fleet_gets) ]] || die "the origin served blobs for the fleet: $(fleet_gets | sort | uniq -c)"
lookups=$(origin_blob_gets | tail -n +$((BEFORE + 1)) | grep -c " oci-client/" || true)
for f in "${figures[@]}"; do
  read -r n bytes <<<"$f"
  printf '   N = %3d: origin blob bytes for the fleet %d, and %d once, for the preheat; %d without the mirror\n' \
    "$n" "$bytes" "$SIZE" $((n * SIZE))
done
echo "   (and $lookups GETs of the build manifest by the operator's own store lookups, which use no mirror)"
echo "registry-mirror e2e passed"
