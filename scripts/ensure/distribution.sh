#!/usr/bin/env bash
# Builds the CNCF Distribution registry 3.1.2 (github.com/distribution/distribution/v3, the
# registry Docker Hub and Harbor run; Debian packages only 2.8 as docker-registry), used as the
# pull-through cache in front of kiln's store registry in the mirror tests (store/tests/oci.rs,
# e2e/tests/store-oci.sh). Prints the path of the binary.
#
# Why 3 and not Debian's 2.8 for the cache: 2.8's proxy fetches a cold blob from the origin twice
# (one stream for the client, one more for its own storage); 3.x tees the one fetch into both
# (registry/proxy/proxyblobstore.go, `io.MultiWriter(w, bw)`), so a blob pulled once is fetched
# once. Neither makes a second client wait for a blob in flight: a pull that starts while the
# cache is still fetching goes to the origin on its own, which is why kiln preheats its mirrors
# after a publish.
#
# From the Go module proxy only ($KILN_GOPROXY, default https://proxy.golang.org; never
# `direct`), as scripts/ensure/oras.sh (kiln_go_install in scripts/lib.sh): the module checked
# against the go.sum hash pinned below, Go 1.26.0 or newer (its go.mod), a static binary. Kept in
# $KILN_CACHE_DIR/distribution-3.1.2 (default /var/cache/kiln as root, ~/.cache/kiln otherwise):
# a 56 MB binary, built with about 4.5 minutes of CPU (83 s on 2 idle cores, 15 min beside a
# busy build). Idempotent: nothing is fetched or built when the binary there says it is 3.1.2
# (`registry --version`; unstamped builds say v3.1.2+unknown).
# Exit status 1, with the reason on stderr, when Go is missing or too old, the module proxy
# cannot be reached on first use, or the module is not the pinned one.
#
#   scripts/ensure/distribution.sh   # prints .../distribution-3.1.2/bin/registry
#   "$(scripts/ensure/distribution.sh)" serve config.yml
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-distribution

VERSION=3.1.2
MODULE=github.com/distribution/distribution/v3
GO_MIN=1.26.0
# go.sum's hash of github.com/distribution/distribution/v3 v3.1.2 (sum.golang.org's).
MODULE_SUM=h1:/Bv2YIqqSR00HiO49FT93hovy6r9IlrzwUDsJjCN5qg=

cache=$(kiln_cache_dir)
dir=$cache/distribution-$VERSION
installed() {
  [[ -x $dir/bin/registry && $("$dir/bin/registry" --version 2>/dev/null) == *" v$VERSION"* ]]
}

kiln_once "$dir" installed "$dir/bin/registry"
kiln_need_go "$GO_MIN" "distribution $VERSION"
kiln_go_install "$dir" registry "$MODULE" "$VERSION" "$MODULE_SUM" "$MODULE/cmd/registry"
installed || die "$dir/bin/registry does not say v$VERSION: $("$dir/bin/registry" --version 2>&1 | tail -3)"
echo "$dir/bin/registry"
