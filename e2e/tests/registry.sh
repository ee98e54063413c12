#!/usr/bin/env bash
# The cluster's OCI registry (Debian docker-registry at $REGISTRY_ADDR, plain HTTP): a pod reaches
# it at the node address and gets the distribution API's answer; a blob pushed over the API from
# the cluster's network namespace lands on disk under $REGISTRY_DIR, where tests corrupt blobs;
# the registry serves exactly the bytes it holds there; and the kubelet pulls an image pushed to
# it (skopeo, plain HTTP) by digest.
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

# The kubelet pulls from it: the busybox image pushed there with skopeo (plain HTTP), a pod naming
# it by digest runs, and the kubelet's Pulled event names that reference (no image loaded by hand
# under this name; containerd's hosts.toml for $REGISTRY_ADDR, e2e/lib/components.sh).
digest=$(tar -xOf "$BUSYBOX_TAR" index.json | jq -r '.manifests[0].digest')
ref="$REGISTRY_ADDR/$repo/busybox@$digest"
skopeo copy --quiet --dest-tls-verify=false "oci-archive:$BUSYBOX_TAR" "docker://$REGISTRY_ADDR/$repo/busybox:test" ||
  fail "skopeo could not push to $REGISTRY_ADDR"
kubectl -n "$TEST_NS" run pulled --image="$ref" --image-pull-policy=Always --restart=Never -- true >/dev/null
kubectl -n "$TEST_NS" wait pod/pulled --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s ||
  { dump "$TEST_NS"; fail "a pod could not run $ref"; }
kubectl -n "$TEST_NS" get events --field-selector reason=Pulled,involvedObject.name=pulled -o json |
  jq -e --arg r "$ref" 'any(.items[]; .message | contains("Successfully pulled image \"" + $r + "\""))' >/dev/null ||
  { dump "$TEST_NS"; fail "no Pulled event for $ref"; }
echo "kubelet pulled $ref and ran it"
