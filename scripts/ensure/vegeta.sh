#!/usr/bin/env bash
# Builds Vegeta, `vegeta` 12.13.0 (github.com/tsenart/vegeta, the HTTP load tool), that drives
# `kiln-agent serve` past its queue in scripts/bench/serve.sh --load's shedding rows: unlike
# perf_analyzer, which stops a run at its first refused request, Vegeta keeps going and records
# every answer (status, headers, latency, body), so a 503 is counted and the admitted requests'
# latency and answers are judged apart. Prints the path of the binary.
#
# From the Go module proxy only ($KILN_GOPROXY, default https://proxy.golang.org; never
# `direct`, so nothing is fetched from GitHub): `go install github.com/tsenart/vegeta/v12@v12.13.0`,
# every module checked against the Go checksum database (sum.golang.org, reached through the
# proxy), the module itself also against the go.sum hash pinned below, with the Go on this machine
# (its go.mod says go 1.22; GOTOOLCHAIN=local, so no other toolchain is fetched) and
# CGO_ENABLED=0, -trimpath, -s -w: a static binary. The version is stamped into main.Version, so
# `vegeta -version` says "Version: 12.13.0". 12.13.0 was the newest release on the proxy when this
# was pinned.
#
# Kept outside the work tree in $KILN_CACHE_DIR/vegeta-12.13.0 (default /var/cache/kiln as root,
# ~/.cache/kiln otherwise), with its modules in $KILN_CACHE_DIR/go/pkg/mod (shared with
# scripts/ensure/oras.sh and cosign.sh). The build cache is this run's own, in its temporary
# directory, and goes with it. Idempotent: the question asked is whether the binary there says the
# pinned version; only then is nothing fetched or built. Built in a temporary directory and renamed
# into place whole, under a lock.
# Exit status 1, with the reason on stderr, when the Go toolchain is missing or too old, the
# module proxy cannot be reached on first use, or the module is not the pinned one.
#
#   scripts/ensure/vegeta.sh        # prints .../vegeta-12.13.0/bin/vegeta
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-vegeta

VERSION=12.13.0
MODULE=github.com/tsenart/vegeta/v12
GO_MIN=1.22
# go.sum's hash of github.com/tsenart/vegeta/v12 v12.13.0 (sum.golang.org's, via the proxy).
MODULE_SUM=h1:J/UiNS3f69MkL0tsRLVUUV8uXXQZxdRUchtS+GYiSFc=

cache=$(kiln_cache_dir)
dir=$cache/vegeta-$VERSION
installed() {
  [[ -x $dir/bin/vegeta && $("$dir/bin/vegeta" -version 2>/dev/null | awk '$1 == "Version:" {print $2}') == "$VERSION" ]]
}

kiln_once "$dir" installed "$dir/bin/vegeta"
kiln_need_go "$GO_MIN" "vegeta $VERSION"
kiln_go_install "$dir" vegeta "$MODULE" "$VERSION" "$MODULE_SUM" "$MODULE" "-X main.Version=$VERSION"
installed || die "$dir/bin/vegeta does not say Version: $VERSION: $("$dir/bin/vegeta" -version 2>&1 | tail -3)"
echo "$dir/bin/vegeta"
