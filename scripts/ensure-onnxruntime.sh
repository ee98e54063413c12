#!/usr/bin/env bash
# Fetches the ONNX Runtime shared library kiln-agent loads at run time (the `ort` crate with
# `load-dynamic`: nothing is downloaded at build time) and prints its path.
#
# The library comes from the PyPI wheel `onnxruntime` 1.31.1 (manylinux x86-64), pinned by the
# wheel's sha256; it is fetched once with `pip download` and kept outside the work tree, in
# $KILN_CACHE_DIR (default /var/cache/kiln as root, ~/.cache/kiln otherwise). Idempotent: a
# cached, checked library is printed without touching the network.
#
#   scripts/ensure-onnxruntime.sh            # prints .../libonnxruntime.so.1.31.1
#   scripts/ensure-onnxruntime.sh --old      # prints an older release (1.20.1), for the test
#                                            # that an agent refuses a library too old for its API
#   scripts/ensure-onnxruntime.sh --newer    # prints a newer release (1.32.0), for the test
#                                            # that an agent accepts a later, compatible library
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
TOOL=ensure-onnxruntime

version=1.31.1
wheel_sha256=5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f
lib_sha256=fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3
if [[ ${1:-} == --old ]]; then
  version=1.20.1
  wheel_sha256=5eec64c0269dcdb8d9a9a53dc4d64f87b9e0c19801d9321246a53b7eb5a7d1bc
  lib_sha256=
elif [[ ${1:-} == --newer ]]; then
  version=1.32.0
  wheel_sha256=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d
  lib_sha256=6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f
fi

[[ $(uname -m) == x86_64 ]] || die "only the x86-64 wheel is pinned; this machine is $(uname -m)"
dir=$(kiln_cache_dir)/onnxruntime-$version
lib=$dir/libonnxruntime.so.$version

check() { [[ -z $2 ]] || [[ $(sha256_of "$1") == "$2" ]]; }

if [[ -f $lib ]] && check "$lib" "$lib_sha256"; then
  echo "$lib"
  exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The library inside does not depend on the Python version; pin one so the same wheel (and
# digest) is fetched whatever python3 this machine has.
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.11 --platform manylinux_2_28_x86_64 --implementation cp \
  "onnxruntime==$version" -d "$tmp" >&2
whl=$(ls "$tmp"/onnxruntime-"$version"-*.whl)
check "$whl" "$wheel_sha256" || die "$whl does not have the pinned sha256 $wheel_sha256"
python3 - "$whl" "onnxruntime/capi/libonnxruntime.so.$version" "$tmp/lib" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
check "$tmp/lib" "$lib_sha256" || die "the library in the wheel does not have the pinned sha256 $lib_sha256"
chmod 0755 "$tmp/lib"
mv -f "$tmp/lib" "$lib"
echo "$lib"
