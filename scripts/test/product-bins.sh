#!/usr/bin/env bash
# Builds the binaries kiln ships (kiln-operator, kiln-agent, kiln-csi, kubectl-kiln) as a product build does:
# default features, `--locked`, the dev profile of the target directory in use ($CARGO_TARGET_DIR,
# else target/), and copies them into DIR. What goes into the images the tests build and push
# must be the product, whatever ran before in that target directory: `cargo test --features
# fault-injection` leaves a kiln-agent with the test-only crash hook where the product binary was
# (cargo uplifts the last feature set built), and an image made of it would pass tests the product
# might fail. So this builds explicitly (after `cargo test` the objects are fresh and it only
# copies), then refuses any copy that carries the hook's marker string.
#
#   scripts/test/product-bins.sh DIR           # prints DIR; DIR/kiln-operator, DIR/kiln-agent, ...
#   scripts/test/product-bins.sh --check FILE  # exit 1 when FILE carries the fault-injection hook
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=product-bins
BINS=(kiln-operator kiln-agent kiln-csi kubectl-kiln)
# The hook's marker (engines/src/pipeline/isolate/fault.rs, `MARKER`), present in a binary
# exactly when the feature compiled the hook in.
MARKER='kiln-fault-inject:'

has_hook() { grep -qaF "$MARKER" "$1"; }

if [[ ${1:-} == --check ]]; then
  [[ -f ${2:-} ]] || die "--check needs a binary"
  ! has_hook "$2" || die "$2 carries the test-only fault-injection hook (built with --features fault-injection): not a product binary"
  exit 0
fi
dir=${1:?usage: scripts/test/product-bins.sh DIR}
mkdir -p "$dir"
target=${CARGO_TARGET_DIR:-$REPO/target}
args=()
for b in "${BINS[@]}"; do args+=(-p "$b"); done
(cd "$REPO" && cargo build -q --locked --bins "${args[@]}") || die "cargo build of ${BINS[*]} failed"
for b in "${BINS[@]}"; do
  install -m 755 "$target/debug/$b" "$dir/$b"
  ! has_hook "$dir/$b" || die "$target/debug/$b carries the fault-injection hook after a product build"
done
echo "$dir"
