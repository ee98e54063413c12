#!/usr/bin/env bash
# Fetches the CUDA 13.0 compiler and the headers and libraries a CUDA build of llama.cpp links
# (scripts/build-agent-cuda.sh), all from NVIDIA's PyPI wheels, and lays them out as a CUDA
# toolkit root that nvcc and CMake's FindCUDAToolkit accept. Prints that root.
#
# The wheels are pinned by version and sha256 (pip checks them: --require-hashes), fetched once
# and kept outside the work tree in $KILN_CACHE_DIR (default /var/cache/kiln as root,
# ~/.cache/kiln otherwise). The root is assembled in a temporary directory and renamed into
# place only when complete, so its existence means it is whole: a second run prints it without
# touching the network. The wheels (530 MB) are deleted once unpacked; the root holds 840 MB.
#
#   scripts/ensure/cuda-toolkit.sh             # prints .../cuda-toolkit-13.0.88-<pins>
#
# What each wheel gives (they all unpack below nvidia/cu13/, one merged tree):
#   nvidia-cuda-nvcc 13.0.88      bin/: nvcc, ptxas, fatbinary, nvlink, cudafe++, nvcc.profile
#   nvidia-nvvm 13.0.88           nvvm/: cicc (nvcc's front end) and libdevice
#   nvidia-cuda-crt 13.0.88       include/crt: the headers nvcc includes first
#   nvidia-cuda-runtime 13.0.96   include/cuda_runtime*.h, lib/libcudart.so.13
#   nvidia-cuda-cccl 13.0.85      include/cccl: CUB, Thrust, libcu++ (ggml-cuda uses CUB)
#   nvidia-cublas 13.1.0.3        include/cublas*.h, lib/libcublas{,Lt}.so.13
# The runtime and cuBLAS are the very wheels scripts/ensure/onnxruntime-gpu.sh puts in the GPU
# image, so what llama.cpp is linked against here is what it loads there.
#
# The layout nvcc.profile expects of a toolkit: targets/x86_64-linux/{include,lib} (links to
# include and lib), lib64 (a link to lib), and the unversioned names the linker looks for
# (libcudart.so, libcublas.so, libcublasLt.so). No driver stub (lib/stubs/libcuda.so): the build
# uses GGML_CUDA_NO_VMM, so nothing links the driver; the CUDA runtime opens it at run time.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-cuda-toolkit

version=13.0.88
# wheel==version sha256
wheels=(
  "nvidia-cuda-nvcc==13.0.88 56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
  "nvidia-nvvm==13.0.88 c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"
  "nvidia-cuda-crt==13.0.88 2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"
  "nvidia-cuda-runtime==13.0.96 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"
  "nvidia-cuda-cccl==13.0.85 e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"
  "nvidia-cublas==13.1.0.3 ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"
)

[[ $(uname -m) == x86_64 ]] || die "only the x86-64 wheels are pinned; this machine is $(uname -m)"
KILN_CACHE_DIR=$(kiln_cache_dir)
# The pins are part of the name: changing one fetches into a new directory.
pins=$(printf '%s\n' "${wheels[@]}" | sha256sum | cut -c1-8)
dir=$KILN_CACHE_DIR/cuda-toolkit-$version-$pins
if [[ -x $dir/bin/nvcc ]]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$KILN_CACHE_DIR"
tmp=$(mktemp -d "$KILN_CACHE_DIR/.fetch-cuda-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/wheels" "$tmp/unpacked"
printf '%s\n' "${wheels[@]}" | sed 's/ / --hash=sha256:/' >"$tmp/requirements.txt"
echo "ensure-cuda-toolkit: fetching ${#wheels[@]} wheels (530 MB) into $KILN_CACHE_DIR" >&2
python3 -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: --require-hashes \
  --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 \
  -r "$tmp/requirements.txt" -d "$tmp/wheels" >&2
for w in "${wheels[@]}"; do
  read -r spec sha <<<"$w"
  name=${spec%%==*} ver=${spec#*==}
  whl=$(ls "$tmp/wheels/${name//-/_}-$ver"-*.whl)
  # pip checked the hash already; check again so a cache filled by other means cannot pass.
  [[ $(sha256_of "$whl") == "$sha" ]] || die "$whl does not have the pinned sha256 $sha"
  python3 - "$whl" "$tmp/unpacked" <<'PY'
import os, shutil, stat, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
prefix = "nvidia/cu13/"
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/") or "/.metadata/" in name:
            continue
        rel = os.path.normpath(name[len(prefix):])
        if rel.startswith("..") or os.path.isabs(rel):
            sys.exit(f"ensure-cuda-toolkit: {whl} holds {name!r}, outside the toolkit")
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with z.open(info) as src, open(dst, "wb") as f:
            shutil.copyfileobj(src, f, 1 << 20)
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(dst, 0o755 if mode & stat.S_IXUSR else 0o644)
PY
  rm -f "$whl"
done
root=$tmp/unpacked
mkdir -p "$root/targets/x86_64-linux"
ln -s ../../include "$root/targets/x86_64-linux/include"
ln -s ../../lib "$root/targets/x86_64-linux/lib"
ln -s lib "$root/lib64"
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  [[ -f $root/lib/$lib ]] || die "no lib/$lib in the wheels"
  ln -s "$lib" "$root/lib/${lib%.13}"
done
"$root/bin/nvcc" --version | grep -q "release 13.0, V$version" ||
  { echo "ensure-cuda-toolkit: the unpacked nvcc is not CUDA $version:" >&2; "$root/bin/nvcc" --version >&2; exit 1; }
chmod 755 "$root"
mv -T "$root" "$dir"
echo "$dir"
