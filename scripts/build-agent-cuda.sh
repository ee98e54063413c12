#!/usr/bin/env bash
# Builds the GPU agent's kiln-agent: llama.cpp with its CUDA backend (feature `cuda`), compiled
# by the CUDA 13.0 nvcc of scripts/ensure-cuda-toolkit.sh (PyPI wheels, pinned) for the GPU
# architectures in KILN_CUDA_ARCHITECTURES. Release profile, in its own target directory
# (target/cuda), so the CPU build in target/release is never replaced by this one.
#
#   scripts/build-agent-cuda.sh            # prints the directory holding kiln-agent and the
#                                          # llama.cpp libraries it links (libllama.so,
#                                          # libggml.so, libggml-base.so, libggml-cpu.so,
#                                          # libggml-cuda.so)
#
# KILN_CUDA_ARCHITECTURES: CMake's CUDA_ARCHITECTURES list (default 90-real: H100 and H200).
# Each architecture costs about 55 CPU-minutes of nvcc (ggml's kernels); add 80-real (A100),
# 89-real (L4, L40S) or 120a-real (Blackwell) for the fleet's GPUs, or 80-virtual for PTX that
# newer GPUs compile when they first load it. The agent refuses a GPU whose compute capability
# the build has no kernels for: the list is compiled into it (KILN_CUDA_ARCHITECTURES).
#
# Needs what a CPU build needs (scripts/ensure-packages.sh) plus g++ as nvcc's host compiler.
set -euo pipefail
REPO=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
archs=${KILN_CUDA_ARCHITECTURES:-90-real}
[[ $archs =~ ^[0-9]+[af]?(-real|-virtual)?(\;[0-9]+[af]?(-real|-virtual)?)*$ ]] ||
  { echo "build-agent-cuda: KILN_CUDA_ARCHITECTURES=$archs is not a list like 80-real;90-real" >&2; exit 2; }
toolkit=$("$REPO/scripts/ensure-cuda-toolkit.sh")
out=$REPO/target/cuda/release

# The llama.cpp build reads CMAKE_* from the environment (llama-cpp-sys-2's build script passes
# them to CMake); CUDAToolkit_ROOT is CMake's own. PATH: nvcc finds cicc through its profile.
export CUDAToolkit_ROOT=$toolkit CUDACXX=$toolkit/bin/nvcc
export CMAKE_CUDA_COMPILER=$toolkit/bin/nvcc CMAKE_CUDA_ARCHITECTURES=$archs
# kiln-agent reads the list at compile time (the GPUs it has kernels for). llama.cpp's CMake
# configures once per target directory, so another list starts its build afresh.
export KILN_CUDA_ARCHITECTURES=$archs
built=$REPO/target/cuda/cuda-architectures.txt
if [[ -f $built && $(cat "$built") != "$archs" ]]; then
  cargo clean --release --target-dir "$REPO/target/cuda" -p llama-cpp-sys-2 >&2
fi
cargo build --release --locked -p kiln-agent --features cuda --target-dir "$REPO/target/cuda" >&2

for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so libggml-cuda.so; do
  [[ -f $out/$lib ]] || { echo "build-agent-cuda: the build left no $out/$lib" >&2; exit 1; }
done
echo "$archs" >"$built"
echo "$out"
