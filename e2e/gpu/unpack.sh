#!/usr/bin/env bash
# On the GPU machine: joins the CUDA provider's parts (checked against their sha256), unpacks
# kiln-agent and the ONNX Runtime libraries of e2e/gpu/pack.sh into DEST and prints the
# environment to run with: ORT_DYLIB_PATH, and LD_LIBRARY_PATH holding DEST's libraries and the
# CUDA 13 / cuDNN 9 libraries of LIBS (default: every site-packages/nvidia/*/lib directory of
# the machine's Python environments, where pip's nvidia-* wheels put them).
#
#   eval "$(e2e/gpu/unpack.sh BASE_DIR PARTS_DIR [DEST] [LIBS])"    (DEST default /tmp/kiln-gpu)
set -euo pipefail
B=$1 PARTS=$2 T=${3:-/tmp/kiln-gpu} LIBS=${4:-}
mkdir -p "$T/ort"
if [[ ! -f $T/ort/libonnxruntime_providers_cuda.so ]]; then
  cat "$PARTS"/cuda.so.xz.* >"$T/cuda.so.xz"
  [[ $(sha256sum "$T/cuda.so.xz" | cut -d' ' -f1) == "$(cat "$B/cuda.sha256")" ]] ||
    { echo "unpack.sh: the parts in $PARTS do not join to the packed provider (sha256); carry every part" >&2; exit 1; }
  xz -dc "$T/cuda.so.xz" >"$T/ort/libonnxruntime_providers_cuda.so"
  rm "$T/cuda.so.xz"
fi
xz -dc "$B/libonnxruntime.so.1.31.1.xz" >"$T/ort/libonnxruntime.so.1.31.1"
cp "$B/libonnxruntime_providers_shared.so" "$T/ort/"
xz -dc "$B/kiln-agent.xz" >"$T/kiln-agent"
chmod +x "$T/kiln-agent"
[[ -n $LIBS ]] || LIBS=$(find / -xdev -path '*/site-packages/nvidia/*/lib' -type d 2>/dev/null | sort -u | paste -sd:)
echo "export ORT_DYLIB_PATH=$T/ort/libonnxruntime.so.1.31.1 LD_LIBRARY_PATH=$T/ort${LIBS:+:$LIBS}"
