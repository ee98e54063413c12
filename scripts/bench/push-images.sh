#!/usr/bin/env bash
# What kiln's images cost to build and push: scripts/push-images.sh of the operator, agent and GPU
# agent images to a local registry (Debian's docker-registry on a free port, plain HTTP, storage
# in a temporary directory), with each image's compressed size, and as the bound the same bytes
# uploaded by curl to the same registry, each image's blobs as monolithic blob uploads (what a
# push cannot beat: the registry's own ingest). Prints the machine's load before and after.
#
#   scripts/bench/push-images.sh [--images LIST] [--operator-bin F --agent-bin F]
#
# Binaries: target/release (push-images.sh builds them when missing). The GPU image fetches
# 1.2 GB once (scripts/ensure/onnxruntime-gpu.sh). Needs about 3 GB in ${TMPDIR:-/var/tmp}.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=bench-push-images
command -v docker-registry >/dev/null || die "docker-registry missing (scripts/ensure-packages.sh)"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-bench-push.XXXXXX")
pid=
trap '[[ -z $pid ]] || kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
port=$(free_port)
cat >"$work/registry.yml" <<YAML
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/data}}
http: {addr: 127.0.0.1:$port, secret: bench}
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
pid=$!
for ((i = 0; i < 50; i++)); do curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done

echo "load before: $(cat /proc/loadavg)"
TMPDIR=$work "$REPO/scripts/push-images.sh" --plain-http --tag bench "$@" "localhost:$port/kiln" \
  >"$work/pushed" 2>"$work/push.log" || { tail -20 "$work/push.log" >&2; exit 1; }
grep -E '^push-images: (built|pushed|[0-9])' "$work/push.log"

# The bound: the same blobs (layers and config) into the same registry by curl, one monolithic
# upload each, into another repository so that nothing is already there.
printf '%-10s %12s %10s %10s %8s\n' image compressed push curl ratio
while read -r name ref; do
  seconds=$(sed -n "s/^push-images: pushed $name (.*) in \([0-9.]*\)s$/\1/p" "$work/push.log")
  manifest=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://127.0.0.1:$port/v2/kiln/$name/manifests/${ref#*@}")
  bytes=0 curl_s=0
  for digest in $(jq -r '.config.digest, .layers[].digest' <<<"$manifest"); do
    curl -fsS "http://127.0.0.1:$port/v2/kiln/$name/blobs/$digest" -o "$work/blob"
    bytes=$((bytes + $(stat -c %s "$work/blob")))
    t1=$(date +%s.%N)
    location=$(curl -fsSi -X POST "http://127.0.0.1:$port/v2/bound/$name/blobs/uploads/" | tr -d '\r' | awk -F': ' 'tolower($1) == "location" {print $2}')
    [[ $location == http* ]] || location=http://127.0.0.1:$port$location
    curl -fsS -H 'Content-Type: application/octet-stream' -T "$work/blob" "$location&digest=$digest" >/dev/null
    curl_s=$(awk -v s="$curl_s" -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", s + b - a}')
  done
  printf '%-10s %9.1f MB %9.2fs %9.2fs %7.2fx\n' "$name" "$(awk -v b="$bytes" 'BEGIN {print b / 1e6}')" "$seconds" \
    "$curl_s" "$(awk -v a="$seconds" -v b="$curl_s" 'BEGIN {print (b > 0 ? a / b : 0)}')"
done <"$work/pushed"
echo "load after: $(cat /proc/loadavg)"
