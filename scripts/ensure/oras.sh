#!/usr/bin/env bash
# Builds the ORAS CLI, `oras` 1.3.6 (oras.land/oras, the newest release this machine's Go builds),
# that pushes OCI artifacts (a CNCF ModelPack model, or one plain model file) to a registry for
# kiln's `oci://` model sources. Prints the path of the binary.
#
# From the Go module proxy only ($KILN_GOPROXY, default https://proxy.golang.org; never
# `direct`, so nothing is fetched from GitHub): `go install oras.land/oras/cmd/oras@v1.3.6`, every
# module checked against the Go checksum database (sum.golang.org, reached through the proxy),
# the module itself also against the go.sum hash pinned below, with the Go on this machine
# (1.3.6's go.mod says go 1.26.7; GOTOOLCHAIN=local, so no other toolchain is fetched) and
# CGO_ENABLED=0, -trimpath, -s -w: a static binary. oras's version comes from its source
# (internal/version.Version; BuildMetadata is empty when not stamped), so `oras version` says
# "Version: 1.3.6". 1.3.6 was the newest release on the proxy when this was pinned.
#
# Kept outside the work tree in $KILN_CACHE_DIR/oras-1.3.6 (default /var/cache/kiln as root,
# ~/.cache/kiln otherwise): a 12 MB binary, built with about 45 s of CPU (45 s to 1.5 min on 2
# busy cores) from 37 MB of modules fetched into $KILN_CACHE_DIR/go/pkg/mod (kept, and shared with
# scripts/ensure/cosign.sh). The build cache (155 MB) is this run's own, in its temporary
# directory, and goes with it: one build does not read what another is writing or clearing.
# Idempotent: the question asked is whether the binary there runs `version` and says the pinned
# version; only then is nothing fetched or built. Built in a temporary directory and renamed into
# place whole, under a lock.
# Exit status 1, with the reason on stderr, when the Go toolchain is missing or too old, the
# module proxy cannot be reached on first use, or the module is not the pinned one.
#
#   scripts/ensure/oras.sh        # prints .../oras-1.3.6/bin/oras
#   "$(scripts/ensure/oras.sh)" push --plain-http 127.0.0.1:5000/models/m:v1 model.gguf
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-oras

VERSION=1.3.6
MODULE=oras.land/oras
GO_MIN=1.26.7
# go.sum's hash of oras.land/oras v1.3.6 (sum.golang.org's, via proxy.golang.org/sumdb).
MODULE_SUM=h1:Lhsfr2tQLjsu/+CJZp6vYatwKT+62fbIUTlp4lUrfOA=

cache=$(kiln_cache_dir)
dir=$cache/oras-$VERSION
installed() {
  [[ -x $dir/bin/oras && $("$dir/bin/oras" version 2>/dev/null | awk '$1 == "Version:" {print $2}') == "$VERSION" ]]
}

kiln_once "$dir" installed "$dir/bin/oras"
kiln_need_go "$GO_MIN" "oras $VERSION"
kiln_go_install "$dir" oras "$MODULE" "$VERSION" "$MODULE_SUM" "$MODULE/cmd/oras"
installed || die "$dir/bin/oras does not say Version: $VERSION: $("$dir/bin/oras" version 2>&1 | tail -3)"
echo "$dir/bin/oras"
