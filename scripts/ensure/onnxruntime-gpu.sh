#!/usr/bin/env bash
# Fetches what the GPU variant of the agent image carries besides kiln-agent: the ONNX Runtime
# library built for CUDA 13 with its CUDA provider, and the CUDA 13 / cuDNN 9 libraries that
# provider links or opens at run time. Prints the directory holding them, flat.
#
# Everything comes from PyPI wheels, pinned by version and sha256 (pip checks them:
# --require-hashes), fetched once with `pip download` and kept outside the work tree in
# $KILN_CACHE_DIR (default /var/cache/kiln as root, ~/.cache/kiln otherwise). The libraries are
# unpacked into a temporary directory and renamed into place only when all are there, so the
# directory's existence means it is complete: a second run prints it without touching the
# network. The wheels (1.2 GB) are deleted once unpacked; the directory holds 1.6 GB.
#
#   scripts/ensure/onnxruntime-gpu.sh          # prints .../onnxruntime-gpu-1.31.1-cu13.0/lib
#   scripts/ensure/onnxruntime-gpu.sh --list   # prints the files it holds and the wheel of each
#
# Which libraries, and why (readelf -d and the strings the libraries dlopen):
#   onnxruntime-gpu 1.31.1     libonnxruntime.so.1.31.1, libonnxruntime_providers_shared.so and
#                              libonnxruntime_providers_cuda.so (the TensorRT provider is left
#                              out: TensorRT 10 has no installable wheel, see e2e/README.md)
#   the CUDA provider needs    libcublas.so.13, libcublasLt.so.13, libcurand.so.10,
#                              libcudart.so.13 (DT_NEEDED) and libcuda.so.1, the driver, which the
#                              NVIDIA container runtime mounts; it dlopens libcudnn.so.9 (convolutions;
#                              without it they fail) and libnvrtc.so.13 (run-time compiled kernels)
#   cuDNN 9 dlopens            its sub-libraries libcudnn_{graph,ops,cnn,adv,heuristic,
#                              engines_precompiled,engines_runtime_compiled}.so.9, which need
#                              libz.so.1 (the image's system library) and open libcublasLt.so.13
#                              and libnvrtc.so.13; NVRTC opens libnvrtc-builtins.so.13.0
#   left out                   cuFFT (286 MB; the provider opens it only for the contrib Rfft/Irfft
#                              operators, which then fail to run) and the wheels' other libraries
#                              (nvblas, cufftw, the NVRTC .alt ABI)
# The CUDA set is CUDA 13.0 update 2's (runtime 13.0.96), so driver 580 (CUDA 13.0) runs it.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-onnxruntime-gpu

version=1.31.1
cuda=13.0
# wheel==version sha256 member... (members are paths inside the wheel)
wheels=(
  "onnxruntime-gpu==$version e26c475fe361b2015f45b4b824bd13f0bb20204e59b62814e6f0acd5f3d491a6
    onnxruntime/capi/libonnxruntime.so.$version onnxruntime/capi/libonnxruntime_providers_shared.so
    onnxruntime/capi/libonnxruntime_providers_cuda.so"
  "nvidia-cublas==13.1.0.3 ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171
    nvidia/cu13/lib/libcublas.so.13 nvidia/cu13/lib/libcublasLt.so.13"
  "nvidia-cuda-runtime==13.0.96 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
    nvidia/cu13/lib/libcudart.so.13"
  "nvidia-curand==10.4.0.35 1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc
    nvidia/cu13/lib/libcurand.so.10"
  "nvidia-cuda-nvrtc==13.0.88 ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
    nvidia/cu13/lib/libnvrtc.so.13 nvidia/cu13/lib/libnvrtc-builtins.so.13.0"
  "nvidia-cudnn-cu13==9.13.1.26 a0f434a881ce8b35afe3a328634db1da4a3852fc6dfbe89577f3e78400ee10d0
    nvidia/cudnn/lib/libcudnn.so.9 nvidia/cudnn/lib/libcudnn_graph.so.9 nvidia/cudnn/lib/libcudnn_ops.so.9
    nvidia/cudnn/lib/libcudnn_cnn.so.9 nvidia/cudnn/lib/libcudnn_adv.so.9 nvidia/cudnn/lib/libcudnn_heuristic.so.9
    nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9 nvidia/cudnn/lib/libcudnn_engines_runtime_compiled.so.9"
)

if [[ ${1:-} == --list ]]; then
  for w in "${wheels[@]}"; do
    read -r -d "" -a f <<<"$w" || true
    for m in "${f[@]:2}"; do echo "${m##*/} ${f[0]}"; done
  done
  exit 0
fi
[[ $(uname -m) == x86_64 ]] || die "only the x86-64 wheels are pinned; this machine is $(uname -m)"
KILN_CACHE_DIR=$(kiln_cache_dir)
# The pins are part of the name: changing one fetches into a new directory.
pins=$(printf '%s\n' "${wheels[@]}" | sha256sum | cut -c1-8)
dir=$KILN_CACHE_DIR/onnxruntime-gpu-$version-cu$cuda-$pins
if [[ -d $dir/lib ]]; then
  echo "$dir/lib"
  exit 0
fi

mkdir -p "$KILN_CACHE_DIR"
tmp=$(mktemp -d "$KILN_CACHE_DIR/.fetch-gpu-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/wheels" "$tmp/lib"
for w in "${wheels[@]}"; do
  read -r -d "" -a f <<<"$w" || true
  echo "${f[0]} --hash=sha256:${f[1]}"
done >"$tmp/requirements.txt"
# The libraries do not depend on the Python version; pin one (onnxruntime-gpu's wheel is per
# CPython) so that the same wheels (and digests) are fetched whatever python3 this machine has.
# NVIDIA's wheels are py3-none with several manylinux tags; list the ones they use.
echo "ensure-onnxruntime-gpu: fetching ${#wheels[@]} wheels (1.2 GB) into $KILN_CACHE_DIR" >&2
python3 -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: --require-hashes \
  --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 \
  -r "$tmp/requirements.txt" -d "$tmp/wheels" >&2
for w in "${wheels[@]}"; do
  read -r -d "" -a f <<<"$w" || true
  name=${f[0]%%==*} ver=${f[0]#*==}
  whl=$(ls "$tmp/wheels/${name//-/_}-$ver"-*.whl)
  # pip checked the hash already; check again so a cache filled by other means cannot pass.
  [[ $(sha256_of "$whl") == "${f[1]}" ]] || die "$whl does not have the pinned sha256 ${f[1]}"
  python3 - "$whl" "$tmp/lib" "${f[@]:2}" <<'PY'
import os, shutil, sys, zipfile
whl, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(whl) as z:
    for m in members:
        dst = os.path.join(out, os.path.basename(m))
        with z.open(m) as src, open(dst, "wb") as f:
            shutil.copyfileobj(src, f, 1 << 20)
        os.chmod(dst, 0o755)
PY
  rm -f "$whl"
done
rm -rf "$tmp/wheels"
(cd "$tmp/lib" && sha256sum -- * >"$tmp/SHA256SUMS")
chmod 755 "$tmp"
mkdir -p "$(dirname "$dir")"
mv -T "$tmp" "$dir"
trap - EXIT
echo "$dir/lib"
