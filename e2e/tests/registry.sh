#!/usr/bin/env bash
# The cluster's OCI registry (Debian docker-registry at $REGISTRY_ADDR, plain HTTP): a pod reaches
# it at the node address and gets the distribution API's answer; a blob pushed over the API from
# the cluster's network namespace lands on disk under $REGISTRY_DIR, where tests corrupt blobs;
# and the registry serves exactly the bytes it holds there.
source "$(dirname "$0")/lib.sh"
ensure_busybox
test_namespace

NS_EXEC=(nsenter --net="/run/netns/$NETNS")
"${NS_EXEC[@]}" curl -fsS "http://$REGISTRY_ADDR/v2/" | grep -qx '{}' ||
  fail "registry at $REGISTRY_ADDR does not answer /v2/ from the node's namespace"

kubectl -n "$TEST_NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: registry-client}
spec:
  restartPolicy: Never
  containers:
  - name: get
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'wget -q -S -O - http://$REGISTRY_ADDR/v2/ 2>&1']
YAML
kubectl -n "$TEST_NS" wait pod/registry-client --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s ||
  { dump "$TEST_NS"; fail "pod could not GET http://$REGISTRY_ADDR/v2/"; }
out=$(kubectl -n "$TEST_NS" logs registry-client)
grep -q 'Docker-Distribution-Api-Version: registry/2.0' <<<"$out" || fail "pod got: $out"
echo "pod -> http://$REGISTRY_ADDR/v2/: $(grep -m1 'HTTP/' <<<"$out" | tr -d '\r')"

# Monolithic blob upload (POST ?digest=) and read-back; the bytes are on disk where tests look.
blob=$(mktemp)
trap 'rm -f "$blob"; kubectl delete namespace "$TEST_NS" --wait=false >/dev/null 2>&1 || true' EXIT
head -c 65536 /dev/urandom >"$blob"
hex=$(sha256sum "$blob" | cut -d' ' -f1)
repo="e2e-$TEST_NS"
loc=$("${NS_EXEC[@]}" curl -fsS -o /dev/null -w '%header{location}' -X POST "http://$REGISTRY_ADDR/v2/$repo/blobs/uploads/")
[[ -n $loc ]] || fail "no upload location"
[[ $loc == http* ]] || loc="http://$REGISTRY_ADDR$loc"
sep='?'; [[ $loc == *\?* ]] && sep='&'
"${NS_EXEC[@]}" curl -fsS -X PUT -H 'Content-Type: application/octet-stream' \
  --data-binary "@$blob" "$loc${sep}digest=sha256:$hex" >/dev/null || fail "blob upload failed"
on_disk="$REGISTRY_DIR/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex/data"
cmp -s "$blob" "$on_disk" || fail "blob not at $on_disk"
got=$("${NS_EXEC[@]}" curl -fsS "http://$REGISTRY_ADDR/v2/$repo/blobs/sha256:$hex" | sha256sum | cut -d' ' -f1)
[[ $got == "$hex" ]] || fail "served blob sha256 $got, want $hex"
echo "blob sha256:$hex stored at $on_disk and served back intact"
