#!/usr/bin/env bash
# kiln's images, one recipe for every way they are made: the e2e tests (e2e/tests/kiln-lib.sh),
# scripts/push-images.sh and the Containerfile all build them here, with e2e/build-image.
#
#   scripts/build-images.sh [--images LIST] [--name-prefix PREFIX] [--tag TAG]
#                           [--operator-bin FILE] [--agent-bin FILE] [--csi-bin FILE]
#                           [--cuda-agent DIR] [--rootfs] OUTDIR
#
# LIST: comma-separated, of
#   operator   kiln-operator (stripped) and the libraries it links, CA certificates
#   csi        kiln-csi (stripped), the privileged CSI node plugin: no engine, no ONNX Runtime
#   agent      kiln-agent (stripped), the ONNX Runtime library of scripts/ensure-onnxruntime.sh at
#              /usr/lib/onnxruntime (ORT_DYLIB_PATH; ORT_DISABLE_TELEMETRY=1 keeps the library's
#              telemetry off), CA certificates
#   compiler   what compile Jobs run to compile backend.kind iree (chart compile.image): the agent
#              image, and in layers of their own Debian's Python 3.11 with its standard library
#              and IREE's compiler, the virtual environment of scripts/ensure/iree.sh at the path
#              it has here (its scripts name their python by that path), KILN_IREE_BIN naming
#              its bin, and /bin/sh (Debian's dash: iree-compile links each module by running
#              its linker through system(3)). About 620 MB; nodes never run it
#   agent-gpu  kiln-agent with the onnxruntime-gpu library, its CUDA provider and the CUDA 13 /
#              cuDNN 9 libraries of scripts/ensure/onnxruntime-gpu.sh in a layer of their own at
#              /usr/lib/onnxruntime (LD_LIBRARY_PATH), libcuda.so.1 left to the NVIDIA container
#              runtime (fetches 1.2 GB on first use). With --cuda-agent DIR (what
#              scripts/build-agent-cuda.sh prints), its kiln-agent is DIR's, whose llama.cpp has
#              the CUDA backend, and llama.cpp's libraries of DIR are in a layer at /usr/lib/llama
#              (also on LD_LIBRARY_PATH); without, it is --agent-bin, whose llama.cpp runs on the
#              CPU only (GGUF targets on GPU classes are refused as IncompatibleRuntime)
# (default: operator,agent,csi,agent-gpu; compiler only when named). Binaries: target/release/kiln-{operator,agent,csi}
# unless given. Each image is written as OUTDIR/kiln-NAME.tar (an OCI archive named PREFIX/NAME:TAG;
# default kiln/NAME:latest), or with --rootfs as the directory OUTDIR/kiln-NAME/ (one directory
# per layer and config.json, see e2e/build-image). Prints one line per image on stdout:
#   NAME<TAB>PATH<TAB>BACKENDS
# where BACKENDS is what the chart's `backends` must say of it (onnxruntime=VERSION@sha256:HEX,
# onnxruntimeGpu=..., and for the compiler onnxruntime=...,iree=VERSION: both) or "-".
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
TOOL=build-images

usage() { sed -n '2,30s/^# \{0,1\}//p' "$0" >&2; exit 2; }
images=operator,agent,csi,agent-gpu prefix=kiln tag=latest rootfs=0 out=
operator_bin=$REPO/target/release/kiln-operator agent_bin=$REPO/target/release/kiln-agent
csi_bin=$REPO/target/release/kiln-csi cuda_agent=
while (($#)); do
  case $1 in
    --images) images=${2:?--images needs a list}; shift ;;
    --name-prefix) prefix=${2:?--name-prefix needs a value}; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift ;;
    --operator-bin) operator_bin=${2:?--operator-bin needs a file}; shift ;;
    --agent-bin) agent_bin=${2:?--agent-bin needs a file}; shift ;;
    --csi-bin) csi_bin=${2:?--csi-bin needs a file}; shift ;;
    --cuda-agent) cuda_agent=${2:?--cuda-agent needs a directory}; shift ;;
    --rootfs) rootfs=1 ;;
    -h | --help) usage ;;
    -*) echo "build-images: unknown option $1" >&2; usage ;;
    *) [[ -z $out ]] || usage; out=$1 ;;
  esac
  shift
done
[[ -n $out ]] || usage
# A CUDA build of kiln-agent: the binary and the llama.cpp libraries it links, by soname.
cuda_agent_complete() {
  [[ -x $cuda_agent/kiln-agent ]] && compgen -G "$cuda_agent/libggml-cuda.so*" >/dev/null ||
    { echo "build-images: --cuda-agent $cuda_agent holds no kiln-agent with libggml-cuda.so (scripts/build-agent-cuda.sh prints the directory)" >&2; return 1; }
}
IFS=, read -ra wanted <<<"$images"
((${#wanted[@]})) || { echo "build-images: --images is empty; name operator, agent, csi or agent-gpu" >&2; exit 2; }
for image in "${wanted[@]}"; do
  case $image in
    operator) [[ -x $operator_bin ]] || die "no kiln-operator at $operator_bin (cargo build --release -p kiln-operator, or --operator-bin)" ;;
    agent-gpu) [[ -z $cuda_agent ]] || cuda_agent_complete || exit 1 ;;&
    agent | agent-gpu | compiler) [[ -x $agent_bin ]] || die "no kiln-agent at $agent_bin (cargo build --release -p kiln-agent, or --agent-bin)" ;;
    csi) [[ -x $csi_bin ]] || die "no kiln-csi at $csi_bin (cargo build --release -p kiln-csi, or --csi-bin)" ;;
    *) echo "build-images: unknown image '$image' in --images; use operator, agent, csi, agent-gpu, compiler" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/bin"

# identity LIB: VERSION@sha256:<hex> of an ONNX Runtime library, what the operator keys on.
identity() { echo "${1##*libonnxruntime.so.}@sha256:$(sha256_of "$1")"; }

# build NAME BINARY BUILD-IMAGE-ARGS...: the image NAME around the stripped BINARY.
build() {
  local name=$1 binary=$2 dest
  shift 2
  strip -o "$out/bin/$(basename "$binary")" "$binary"
  if ((rootfs)); then
    dest=$out/kiln-$name
    rm -rf "$dest"
    set -- --rootfs "$dest" "$@"
  else
    dest=$out/kiln-$name.tar
    set -- --out "$dest" "$@"
  fi
  "$REPO/e2e/build-image" --name "$prefix/$name:$tag" \
    --add /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt "$@" \
    "$out/bin/$(basename "$binary")" >&2
  BUILT=$dest
}

ORT_DIR=/usr/lib/onnxruntime LLAMA_DIR=/usr/lib/llama
# What the operator keys IREE on: the compiler's version and the revision of kiln's flags
# (engines/src/backend/iree: VERSION+FLAGS_REVISION). e2e/tests/serving-iree.sh installs the
# chart with it, so a compile Job whose worker says otherwise fails there.
IREE_VERSION=3.13.0+llvm-cpu.1
for image in "${wanted[@]}"; do
  case $image in
    operator)
      build operator "$operator_bin"
      printf 'operator\t%s\t-\n' "$BUILT" ;;
    csi)
      build csi "$csi_bin"
      printf 'csi\t%s\t-\n' "$BUILT" ;;
    agent)
      lib=$("$REPO/scripts/ensure-onnxruntime.sh")
      build agent "$agent_bin" --add "$lib:$ORT_DIR/$(basename "$lib")" \
        --env "ORT_DYLIB_PATH=$ORT_DIR/$(basename "$lib")" --env ORT_DISABLE_TELEMETRY=1
      printf 'agent\t%s\tonnxruntime=%s\n' "$BUILT" "$(identity "$lib")" ;;
    compiler)
      lib=$("$REPO/scripts/ensure-onnxruntime.sh")
      venv=$(dirname "$("$REPO/scripts/ensure/iree.sh")")
      python=$(readlink -f /usr/bin/python3)
      build compiler "$agent_bin" --add "$lib:$ORT_DIR/$(basename "$lib")" \
        --env "ORT_DYLIB_PATH=$ORT_DIR/$(basename "$lib")" --env ORT_DISABLE_TELEMETRY=1 \
        --add "$python:$python" --symlink "usr/bin/python3:$(basename "$python")" \
        --add "$(readlink -f /bin/sh):/bin/sh" \
        --add-tree "/usr/lib/$(basename "$python")" --add-tree "$venv" \
        --env "KILN_IREE_BIN=$venv/bin" --env PYTHONDONTWRITEBYTECODE=1
      printf 'compiler\t%s\tonnxruntime=%s,iree=%s\n' "$BUILT" "$(identity "$lib")" "$IREE_VERSION" ;;
    agent-gpu)
      libs=$("$REPO/scripts/ensure/onnxruntime-gpu.sh")
      lib=$(echo "$libs"/libonnxruntime.so.1.*)
      binary=$agent_bin libpath=$ORT_DIR llama=()
      if [[ -n $cuda_agent ]]; then
        binary=$cuda_agent/kiln-agent libpath=$ORT_DIR:$LLAMA_DIR
        rm -rf "$out/llama-cuda" && mkdir -p "$out/llama-cuda"
        for f in "$cuda_agent"/lib*.so*; do strip -o "$out/llama-cuda/${f##*/}" "$f"; done
        llama=(--add-dir "$out/llama-cuda:$LLAMA_DIR")
      fi
      build agent-gpu "$binary" --add-dir "$libs:$ORT_DIR" "${llama[@]}" --allow-missing libcuda.so.1 \
        --env "ORT_DYLIB_PATH=$ORT_DIR/$(basename "$lib")" --env "LD_LIBRARY_PATH=$libpath" \
        --env ORT_DISABLE_TELEMETRY=1
      printf 'agent-gpu\t%s\tonnxruntimeGpu=%s\n' "$BUILT" "$(identity "$lib")" ;;
  esac
done
