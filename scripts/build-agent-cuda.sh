#!/usr/bin/env bash
# Builds the GPU agent's kiln-agent: llama.cpp with its CUDA backend (feature `cuda`), compiled
# by the CUDA 13.0 nvcc of scripts/ensure/cuda-toolkit.sh (PyPI wheels, pinned) for the GPU
# architectures in KILN_CUDA_ARCHITECTURES. Release profile, in its own target directory
# (target/cuda), so the CPU build in target/release is never replaced by this one.
#
#   scripts/build-agent-cuda.sh            # prints target/cuda/agent: kiln-agent and, by the
#                                          # names it asks for, the llama.cpp libraries it links
#                                          # (libllama.so.0, libggml.so.0, libggml-base.so.0,
#                                          # libggml-cpu.so.0, libggml-cuda.so.0); the CUDA
#                                          # runtime and cuBLAS are the GPU image's already
#
# KILN_CUDA_ARCHITECTURES: CMake's CUDA_ARCHITECTURES list (default 90-real: H100 and H200).
# Each architecture compiles ggml's 144 CUDA files again (77 minutes for one on 2 busy cores);
# add 80-real (A100), 89-real (L4, L40S) or 120a-real (Blackwell) for the fleet's GPUs, or
# 80-virtual for PTX that newer GPUs compile when they first load it. The agent refuses a GPU whose compute capability
# the build has no kernels for: the list is compiled into it (KILN_CUDA_ARCHITECTURES).
#
# Needs what a CPU build needs (scripts/ensure-packages.sh) plus g++ as nvcc's host compiler.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
TOOL=build-agent-cuda
archs=${KILN_CUDA_ARCHITECTURES:-90-real}
[[ $archs =~ ^[0-9]+[af]?(-real|-virtual)?(\;[0-9]+[af]?(-real|-virtual)?)*$ ]] ||
  { echo "build-agent-cuda: KILN_CUDA_ARCHITECTURES=$archs is not a list like 80-real;90-real" >&2; exit 2; }
toolkit=$("$REPO/scripts/ensure/cuda-toolkit.sh")
out=$REPO/target/cuda/agent

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
# The llama.cpp libraries are in llama-cpp-sys-2's OUT_DIR (what Cargo hard-links beside the
# binary are their unversioned links, dangling there), which Cargo's messages name.
messages=$(cargo build --release --locked -p kiln-agent --features cuda --target-dir "$REPO/target/cuda" \
  --message-format json-render-diagnostics)
lib=$(jq -r 'select(.reason == "build-script-executed" and (.package_id | test("llama-cpp-sys-2"))) | .out_dir' <<<"$messages" | head -1)/lib
[[ -e $lib/libggml-cuda.so ]] || die "no libggml-cuda.so in $lib: llama.cpp was not built with CUDA"

rm -rf "$out" && mkdir -p "$out"
cp "$REPO/target/cuda/release/kiln-agent" "$out/"
# Every library of llama.cpp's build the binary loads (ldd lists them all, transitively), under
# the name it asks for.
LD_LIBRARY_PATH=$lib:$toolkit/lib ldd "$out/kiln-agent" | awk -v d="$lib/" 'index($3, d) == 1 {print $1, $3}' |
  while read -r soname path; do cp -L "$path" "$out/$soname"; done
compgen -G "$out/libggml-cuda.so*" >/dev/null || die "kiln-agent does not load libggml-cuda.so: $(ls "$out")"
if LD_LIBRARY_PATH=$out:$toolkit/lib ldd "$out/kiln-agent" | grep -q 'libcuda\.so'; then
  die "kiln-agent links the driver (libcuda.so); it must not (GGML_CUDA_NO_VMM)"
fi
echo "$archs" >"$built"
echo "$out"
