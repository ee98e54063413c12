#!/usr/bin/env bash
# What a GPU machine without network needs to run kiln-agent's ONNX Runtime CUDA path, packed
# for the `device` tool, whose calls carry at most 64 MiB each:
#
#   e2e/gpu/pack.sh DIR [PART_MB]     (repository root, after a release build of kiln-agent)
#
#   DIR/base/   kiln-agent (stripped, xz), libonnxruntime.so.1.31.1 (xz) and
#               libonnxruntime_providers_shared.so of the onnxruntime-gpu 1.31.1 wheel (built for
#               CUDA 13; scripts/ensure/onnxruntime-gpu.sh fetches it, pinned), and cuda.sha256
#   DIR/parts/  its CUDA provider (284 MB) xz-compressed (~186 MB) and split into PART_MB parts
#               (default 40), so that base and one part travel in one call
#
# The CUDA and cuDNN libraries do not travel: the GPU machine has them in its Python environment
# (e2e/gpu/unpack.sh finds them), or `prove.sh run --libs DIR` names a directory holding them
# (the GPU agent image's /usr/lib/onnxruntime, unpacked). Idempotent: DIR is rebuilt each time.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
D=$1 P=${2:-40}
[[ -x $ROOT/target/release/kiln-agent || -n ${KILN_AGENT_BIN:-} ]] ||
  { echo "pack.sh: no target/release/kiln-agent (cargo build --release -p kiln-agent) and no KILN_AGENT_BIN" >&2; exit 1; }
LIBS=$("$ROOT/scripts/ensure/onnxruntime-gpu.sh")
rm -rf "$D"
mkdir -p "$D/base" "$D/parts"
strip -o "$D/base/kiln-agent" "${KILN_AGENT_BIN:-$ROOT/target/release/kiln-agent}"
xz -6 -T0 -f "$D/base/kiln-agent"
xz -6 -T0 -c "$LIBS/libonnxruntime.so.1.31.1" >"$D/base/libonnxruntime.so.1.31.1.xz"
cp "$LIBS/libonnxruntime_providers_shared.so" "$D/base/"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
xz -6 -T0 -c "$LIBS/libonnxruntime_providers_cuda.so" >"$tmp/cuda.so.xz"
sha256sum "$tmp/cuda.so.xz" | cut -d' ' -f1 >"$D/base/cuda.sha256"
split -b "${P}000000" -d "$tmp/cuda.so.xz" "$D/parts/cuda.so.xz."
du -sh "$D"/base/* "$D"/parts/*
