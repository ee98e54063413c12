#!/usr/bin/env bash
# Builds Sigstore's `cosign` 3.1.3 (github.com/sigstore/cosign/v3, the newest release on the Go
# module proxy when pinned), the third-party verifier kiln's signed entries are checked with:
# `cosign verify-attestation --key signing.pub --type slsaprovenance1 --insecure-ignore-tlog=true
# REGISTRY/REPO@sha256:HEX` for an OCI store entry, `cosign verify-blob-attestation` for a
# filesystem one. Prints the path of the binary.
#
# Built with `go install github.com/sigstore/cosign/v3/cmd/cosign@v3.1.3` from the Go module
# proxy ($KILN_GOPROXY, default https://proxy.golang.org; never `direct`, so nothing is fetched
# from GitHub), with the local toolchain only (GOTOOLCHAIN=local: cosign 3.1.3's go.mod says
# go 1.26.0). The module itself is checked against its pinned go.sum hash (MODULE_SUM below)
# before anything is built, and every dependency against cosign's own go.sum, as always.
# CGO_ENABLED=0, -trimpath, stripped (-s -w): a static binary, as cosign's release builds are
# (no PKCS#11, which needs cgo). `go install` stamps no version, so the release's ldflag is
# passed (-X sigs.k8s.io/release-utils/version.gitVersion=v3.1.3): `cosign version` then says
# "GitVersion: v3.1.3".
#
# Kept outside the work tree in $KILN_CACHE_DIR/cosign-3.1.3/bin/cosign (default /var/cache/kiln
# as root, ~/.cache/kiln otherwise): a 97 MiB static binary. GOPATH, the module cache (about
# 1.8 GB unpacked, from at most 320 MB fetched) and the build cache (about 0.6 GB) live in a
# temporary directory under $KILN_CACHE_DIR that goes when the build ends: one binary does not
# justify keeping 2.4 GB, and no other tool's build can clear them half-way. About 9 minutes
# (1.4 GB of memory) on this machine's 2 cores while other builds ran beside it.
# Idempotent: the question asked is whether the binary runs `cosign version` and says
# GitVersion v3.1.3; only then is nothing fetched or built. Built in a temporary directory and
# renamed into place whole, under a lock.
# Exit status 1, with the reason on stderr, when go is missing or too old, the module proxy
# cannot be reached on first use, or the module's hash is not the pinned one.
#
#   scripts/ensure/cosign.sh        # prints .../cosign-3.1.3/bin/cosign
#   "$(scripts/ensure/cosign.sh)" verify-attestation --key signing.pub --type slsaprovenance1 \
#     --insecure-ignore-tlog=true 127.0.0.1:5000/kiln@sha256:HEX
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-cosign

VERSION=3.1.3
MODULE=github.com/sigstore/cosign/v3
# go.sum's hash of the module's zip, as sum.golang.org records it.
MODULE_SUM=h1:001JQRI/PJ/5T+g/kJ1KTvKFbb322+fomc+pHDZ/6sg=
GO_MIN=1.26.0
PROXY=${KILN_GOPROXY:-https://proxy.golang.org}

cache=$(kiln_cache_dir)
dir=$cache/cosign-$VERSION
installed() {
  [[ -x $dir/bin/cosign && $("$dir/bin/cosign" version 2>/dev/null | awk '$1 == "GitVersion:" {print $2}') == "v$VERSION" ]]
}

kiln_once "$dir" installed "$dir/bin/cosign"
kiln_need_go "$GO_MIN" "cosign $VERSION"
have=$(go env GOVERSION)
have=${have#go}
tmp=$(mktemp -d "$cache/.cosign-XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

# Everything the go command reads from the environment, set here: no go.env, no workspace, no
# toolchain download, no VCS, and every cache in $tmp (the module cache writable, so it can be
# removed with rm -rf).
export GOENV=off GOWORK=off GOTOOLCHAIN=local GOFLAGS=-modcacherw GOPROXY=$PROXY GOSUMDB=off \
  GONOPROXY='' GOPRIVATE='' GONOSUMDB='' GOPATH=$tmp/go GOMODCACHE=$tmp/go/mod \
  GOCACHE=$tmp/gocache GOBIN=$tmp/new/bin CGO_ENABLED=0

echo "$TOOL: building cosign $VERSION with go$have from $PROXY (once, about 10 minutes)" >&2
sum=$(cd "$tmp" && go mod download -json "$MODULE@v$VERSION" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Sum") or "ERROR: " + d.get("Error", "no Sum"))') ||
  die "go mod download $MODULE@v$VERSION failed (the module proxy $PROXY is needed once)"
[[ $sum == "$MODULE_SUM" ]] || die "$MODULE@v$VERSION from $PROXY has hash $sum, not the pinned $MODULE_SUM"
(cd "$tmp" && nice -n 10 go install -trimpath \
  -ldflags="-s -w -X sigs.k8s.io/release-utils/version.gitVersion=v$VERSION" \
  "$MODULE/cmd/cosign@v$VERSION") >&2 ||
  die "go install $MODULE/cmd/cosign@v$VERSION failed (go$have; cosign $VERSION needs $GO_MIN or newer)"
echo "$MODULE $VERSION $MODULE_SUM go$have $PROXY" >"$tmp/new/SOURCES"
rm -rf "$dir"
mv -T "$tmp/new" "$dir"
installed || die "$dir/bin/cosign does not say GitVersion: v$VERSION: $("$dir/bin/cosign" version 2>&1 | tail -3)"
echo "$dir/bin/cosign"
