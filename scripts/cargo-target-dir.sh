#!/usr/bin/env bash
# Prints the cargo target directory scripts/test.sh builds in: outside the work tree, so a fresh
# clone (as CI makes one per run) reuses the last run's build instead of compiling every crate
# again, and keyed by what decides whether that build can be reused at all: the toolchain
# (`rustc -vV`) and Cargo.lock. A new key starts cold; the two most recently used keys are kept
# and older ones removed (each is several GB). $KILN_CACHE_DIR as the other ensure-* scripts
# (default /var/cache/kiln as root, ~/.cache/kiln otherwise). Cargo locks the directory, so two
# checkouts sharing a key build one after the other, never over each other.
#
#   CARGO_TARGET_DIR=$(scripts/cargo-target-dir.sh)
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
key=$( (cd "$REPO" && rustc -vV && cat Cargo.lock) | sha256sum | cut -c1-16)
base=$(kiln_cache_dir)/cargo-target
mkdir -p "$base/$key"
touch "$base/$key"
# Older keys: all but the two newest directories.
ls -1t "$base" | tail -n +3 | while read -r old; do
  [[ $old != "$key" ]] && rm -rf --one-file-system "${base:?}/$old"
done
echo "$base/$key"
