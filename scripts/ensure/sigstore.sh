#!/usr/bin/env bash
# Builds the servers of a private Sigstore instance from their upstream releases, for the test
# that signs a model keyless with the real `model_signing sign sigstore` and checks that kiln
# verifies the bundle offline (scripts/test/sigstore-instance.py runs them):
#
#   fulcio-server   github.com/sigstore/fulcio                 v1.8.8  the certificate authority
#   ct-log          github.com/transparency-dev/tesseract      v0.1.1  its CT log (POSIX tiles)
#   rekor-server    github.com/sigstore/rekor-tiles/v2         v2.3.0  Rekor v2 (POSIX tiles)
#   timestamp-server github.com/sigstore/timestamp-authority/v2 v2.1.3 the RFC 3161 TSA
#
# The newest releases whose go.mod the local toolchain accepts (rekor-tiles v2.4 and
# timestamp-authority v2.1.4 say go 1.27). Each module is checked against its pinned go.sum hash
# before anything is built, every dependency against the module's own go.sum. Built with
# `go install MODULE/cmd@VERSION` from the Go module proxy ($KILN_GOPROXY, default
# https://proxy.golang.org; never `direct`), GOTOOLCHAIN=local, CGO_ENABLED=0, -trimpath,
# stripped: static binaries, as the projects' release images are.
#
# Kept outside the work tree in $KILN_CACHE_DIR/sigstore-<versions>/bin (default /var/cache/kiln
# as root, ~/.cache/kiln otherwise). Modules are kept in $KILN_CACHE_DIR/go, shared by the
# Go-built tools (scripts/lib.sh's kiln_go_install); the build cache goes when the build ends. Idempotent: the question asked is whether each binary answers
# --help (they have no version command that names the release; SOURCES records it); only then
# is nothing fetched or built. Built in a temporary directory and renamed into place whole,
# under a lock. Exit status 1, with the reason on stderr, when go is missing or too old, the
# proxy cannot be reached on first use, or a module's hash is not the pinned one.
#
#   scripts/ensure/sigstore.sh      # prints .../sigstore-<versions>/bin
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-sigstore

# name module version package go.sum-hash
SERVERS=(
  "fulcio-server github.com/sigstore/fulcio v1.8.8 . h1:AtVoVQ4R7YaP6RHIH9puHyB398CHS/9WYc6d+gKf5Y0="
  "ct-log github.com/transparency-dev/tesseract v0.1.1 cmd/tesseract/posix h1:KMyqb5/43noPwaBIuFxaWOnhtx360JRb1nEPqUVn1KQ="
  "rekor-server github.com/sigstore/rekor-tiles/v2 v2.3.0 cmd/rekor-server/posix h1:HhMgH61UP0t899V8Fjt7pz1YdgOBptbaQdnCF+79cdc="
  "timestamp-server github.com/sigstore/timestamp-authority/v2 v2.1.3 cmd/timestamp-server h1:Fc+LjCTfik1lh3YLkaosENfkXa3R2Y1nswiUKutBdFA="
)
GO_MIN=1.26.0
PROXY=${KILN_GOPROXY:-https://proxy.golang.org}

cache=$(kiln_cache_dir)
dir=$cache/sigstore-fulcio1.8.8-tesseract0.1.1-rekor2.3.0-tsa2.1.3
installed() {
  local line name
  for line in "${SERVERS[@]}"; do
    read -r name _ <<<"$line"
    "$dir/bin/$name" --help >/dev/null 2>&1 || return 1
  done
}

kiln_once "$dir" installed "$dir/bin"
kiln_need_go "$GO_MIN" "the Sigstore servers"
have=$(go env GOVERSION)
have=${have#go}
tmp=$(mktemp -d "$cache/.sigstore-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# As kiln_go_install: everything the go command reads from the environment, set here.
export GOENV=off GOWORK=off GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" \
  GOPROXY=$PROXY GOPATH=$cache/go GOMODCACHE=$cache/go/pkg/mod GOCACHE=$tmp/gocache CGO_ENABLED=0

echo "$TOOL: building Fulcio, TesseraCT, Rekor v2 and the timestamp authority with go$have from $PROXY (once, about 15 minutes on 2 busy cores)" >&2
mkdir -p "$tmp/new/bin"
for line in "${SERVERS[@]}"; do
  read -r name module version package pinned <<<"$line"
  sum=$(cd "$tmp" && go mod download -json "$module@$version" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Sum") or "ERROR: " + d.get("Error", "no Sum"))') ||
    die "go mod download $module@$version failed (the module proxy $PROXY is needed once)"
  [[ $sum == "$pinned" ]] || die "$module@$version from $PROXY has hash $sum, not the pinned $pinned"
  target=$module
  [[ $package == . ]] || target=$module/$package
  (cd "$tmp" && GOBIN=$tmp/one nice -n 10 go install -trimpath -ldflags="-s -w" "$target@$version") >&2 ||
    die "go install $target@$version failed (go$have)"
  mv "$tmp/one/$(basename "$target")" "$tmp/new/bin/$name"
  echo "$name $module $version $sum" >>"$tmp/new/SOURCES"
done
echo "go$have $PROXY" >>"$tmp/new/SOURCES"
rm -rf "$dir"
mv -T "$tmp/new" "$dir"
installed || die "a server in $dir/bin does not answer --help"
echo "$dir/bin"
