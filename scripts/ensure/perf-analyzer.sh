#!/usr/bin/env bash
# Installs Triton's load generator, `perf_analyzer` (PyPI `perf-analyzer` 2.60.0: Open Inference
# Protocol v2 over HTTP and gRPC, binary tensors, concurrency sweeps), that scripts/bench/serve.sh
# --load drives kiln-agent serve and KServe with. Prints the path of a wrapper that runs it.
#
# Why not `pip install`: the only x86-64 wheel is tagged manylinux_2_38 and its binary needs
# GLIBC_2.38 and GLIBCXX_3.4.32; Debian 12 has glibc 2.36 and GCC 12's libstdc++. So the binary
# runs under Debian 13 (trixie)'s own loader and libraries, extracted beside it, with the
# system's libraries untouched:
#   * the wheel (`pip download --platform manylinux_2_38_x86_64`), checked against its pinned
#     sha256 (PyPI's simple index), its one binary taken out;
#   * trixie's libc6, libstdc++6, libgcc-s1 and what the binary links besides them (libssl3t64
#     for libssl and libcrypto, zlib1g, and libzstd1 which libcrypto links), each .deb checked
#     against the sha256 of trixie's Packages index, whose own sha256 comes from the InRelease
#     file, whose signature gpgv checks with Debian's archive keyring (debian-archive-keyring
#     holds trixie's keys); then `dpkg-deb -x`, nothing installed through dpkg.
# trixie is a stable release that point releases update, so the packages are looked up by name
# in the index of the day (their versions and sha256 are written to SOURCES): the signature,
# not a pin, is what vouches for them.
#
# The wrapper runs `LOADER --inhibit-cache --library-path LIBS perf_analyzer ARGS`: trixie's
# ld.so, reading neither the system's ld.so.cache nor its library directories for what LIBS holds.
# Kept outside the work tree in $KILN_CACHE_DIR/perf-analyzer-2.60.0 (default /var/cache/kiln as
# root, ~/.cache/kiln otherwise): about 44 MB, from a 7 MB wheel, 6 MB of .debs and a 10 MB
# index, in about 3 s on this machine's link. Idempotent: the question asked is whether the
# wrapper runs `--version`; only then is nothing fetched. Built in a temporary directory and
# renamed into place whole, under a lock.
# Exit status 1, with the reason on stderr, when PyPI or the Debian mirror ($KILN_DEBIAN_MIRROR,
# default http://deb.debian.org/debian; plain HTTP is enough: everything is checked) cannot be
# reached on first use, or a check fails.
#
#   scripts/ensure/perf-analyzer.sh        # prints .../perf-analyzer-2.60.0/bin/perf_analyzer
#   "$(scripts/ensure/perf-analyzer.sh)" -i http -u 127.0.0.1:8000 -m NAME --concurrency-range 1:4:1
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-perf-analyzer

VERSION=2.60.0
WHEEL=perf_analyzer-$VERSION-py3-none-manylinux_2_38_x86_64.whl
WHEEL_SHA256=23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25
MIRROR=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# The binary's NEEDED libraries (readelf -d) and what those link: libssl3t64 needs libzstd1 and
# zlib1g. libssl3t64 also depends on openssl-provider-legacy, a module loaded only on request.
DEBS=(libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g libzstd1)

cache=$(kiln_cache_dir)
dir=$cache/perf-analyzer-$VERSION
# It says "Perf Analyzer Version 0.0.0 (commit 3a49a23)", on stderr: the wheel's build does not
# stamp its version, so the answer is that it runs at all, under this loader and these libraries.
installed() { [[ -x $dir/bin/perf_analyzer && $("$dir/bin/perf_analyzer" --version 2>&1) == "Perf Analyzer Version "* ]]; }

if installed; then
  echo "$dir/bin/perf_analyzer"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9
# Another run may have installed it while this one waited for the lock.
if installed; then
  echo "$dir/bin/perf_analyzer"
  exit 0
fi
for cmd in curl gpgv dpkg-deb xz python3; do
  command -v "$cmd" >/dev/null || die "$cmd is missing (Debian: curl, gpgv, dpkg, xz-utils, python3)"
done
tmp=$(mktemp -d "$cache/.perf-analyzer-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fetch() { curl -fsS --retry 3 --connect-timeout 20 -o "$2" "$1" || die "cannot fetch $1"; }

# wheel: $tmp/new/perf_analyzer, from the wheel of the pinned sha256.
wheel() {
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_38_x86_64 "perf-analyzer==$VERSION" -d "$tmp/wheel" >&2 ||
    die "pip download perf-analyzer==$VERSION failed (PyPI is needed once)"
  local whl=$tmp/wheel/$WHEEL
  [[ -f $whl && $(sha256_of "$whl") == "$WHEEL_SHA256" ]] || die "$WHEEL does not have the pinned sha256 $WHEEL_SHA256"
  python3 - "$whl" "$tmp/new/perf_analyzer" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("perf_analyzer/bin/perf_analyzer") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod 755 "$tmp/new/perf_analyzer"
}

# index: $tmp/Packages, trixie's main amd64 index, its sha256 from the signed InRelease.
index() {
  fetch "$MIRROR/dists/$SUITE/InRelease" "$tmp/InRelease"
  gpgv --keyring "$KEYRING" --output "$tmp/Release" "$tmp/InRelease" 2>"$tmp/gpgv.log" ||
    die "$SUITE's InRelease is not signed by a key of $KEYRING (Debian: debian-archive-keyring): $(tail -2 "$tmp/gpgv.log")"
  grep -qx "Codename: $SUITE" "$tmp/Release" || die "$MIRROR/dists/$SUITE/InRelease is not $SUITE's"
  local sha
  sha=$(awk '/^SHA256:/ {s = 1; next} /^[^ ]/ {s = 0} s && $3 == "main/binary-amd64/Packages.xz" {print $1}' "$tmp/Release")
  [[ -n $sha ]] || die "$SUITE's Release lists no main/binary-amd64/Packages.xz"
  # By hash (Acquire-By-Hash): the file the signed Release names, even while the mirror updates.
  fetch "$MIRROR/dists/$SUITE/main/binary-amd64/by-hash/SHA256/$sha" "$tmp/Packages.xz"
  [[ $(sha256_of "$tmp/Packages.xz") == "$sha" ]] || die "Packages.xz does not have the sha256 the signed Release gives"
  xz -dc "$tmp/Packages.xz" >"$tmp/Packages"
}

# field PACKAGE NAME: the field NAME of PACKAGE's stanza in the index.
field() {
  awk -v p="Package: $1" -v f="$2: " 'BEGIN {RS = ""; FS = "\n"}
    $1 == p {for (i = 2; i <= NF; i++) if (index($i, f) == 1) print substr($i, length(f) + 1); exit}' "$tmp/Packages"
}

# debs: each of DEBS fetched, checked against the index, extracted into $tmp/new/trixie.
debs() {
  local p file sha deb
  for p in "${DEBS[@]}"; do
    file=$(field "$p" Filename) sha=$(field "$p" SHA256)
    [[ -n $file && -n $sha ]] || die "$SUITE's index has no package $p"
    deb=$tmp/debs/${file##*/}
    mkdir -p "$tmp/debs"
    fetch "$MIRROR/$file" "$deb"
    [[ $(sha256_of "$deb") == "$sha" ]] || die "$deb does not have the sha256 of $SUITE's signed index"
    dpkg-deb -x "$deb" "$tmp/new/trixie" || die "dpkg-deb -x $deb failed"
    echo "$p $(field "$p" Version) $file sha256:$sha" >>"$tmp/new/SOURCES"
  done
}

# wrapper: $tmp/new/bin/perf_analyzer, naming the final directory.
wrapper() {
  mkdir -p "$tmp/new/bin"
  cat >"$tmp/new/bin/perf_analyzer" <<SH
#!/bin/sh
# perf_analyzer $VERSION under Debian $SUITE's loader and libraries (scripts/ensure/perf-analyzer.sh).
exec "$dir/trixie/usr/lib64/ld-linux-x86-64.so.2" --inhibit-cache \\
  --library-path "$dir/trixie/usr/lib/x86_64-linux-gnu" --argv0 perf_analyzer "$dir/perf_analyzer" "\$@"
SH
  chmod 755 "$tmp/new/bin/perf_analyzer"
}

mkdir -p "$tmp/new"
echo "$TOOL: perf_analyzer $VERSION with Debian $SUITE's libc and libstdc++ (about 23 MB to fetch, once)" >&2
wheel
echo "perf-analyzer $VERSION $WHEEL sha256:$WHEEL_SHA256" >"$tmp/new/SOURCES"
index
debs
wrapper
rm -rf "$dir"
mv -T "$tmp/new" "$dir"
installed || die "$dir/bin/perf_analyzer does not run --version: $("$dir/bin/perf_analyzer" --version 2>&1 | tail -3)"
echo "$dir/bin/perf_analyzer"
