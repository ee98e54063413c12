#!/usr/bin/env bash
# The GPU variant of the agent image (kiln_gpu_image_tar), checked without a GPU and without the
# cluster: its layers unpacked into a directory, everything run there under chroot, so only what
# the image holds can be found.
#   * every ELF file in the image resolves all its shared libraries with the image's own loader and
#     library path, except libcuda.so.1 (the NVIDIA container runtime mounts the node's driver);
#   * so do the libraries that are opened at run time, not linked: the CUDA and TensorRT-less
#     providers ONNX Runtime opens from its own directory, cuDNN 9 and its sub-libraries, NVRTC
#     and its builtins (scripts/ensure/onnxruntime-gpu.sh says who opens what);
#   * the check fails when a library is missing: one the provider links and one only cuDNN
#     opens, each removed in turn;
#   * the image's config sets ORT_DYLIB_PATH to the GPU library, and kiln-agent runs in it:
#     `probe` reports ONNX Runtime 1.31.1 loaded and no GPU; `local` runs the example on the
#     GPU build's CPU provider and refuses a CUDA target with IncompatibleRuntime, not a crash and
#     not the CPU instead, because ONNX Runtime's own load of the CUDA provider found everything
#     but libcuda.so.1 (no driver here).
#   * GGUF on llama.cpp in the image: the tiny llama on the CPU is Ready; on CUDA it is refused
#     with the reason that fits the image: with the CUDA build of llama.cpp (kiln_cuda_agent:
#     its libraries at /usr/lib/llama, checked above like the rest, and the check fails without
#     libggml-cuda.so) IncompatibleHardware, as there is no GPU here; without it
#     IncompatibleRuntime naming the GPU agent's build. Which one ran is printed.
# Prints the image's size, compressed and not, and how long the fetch and the build took.
# KILN_E2E_GPU_IMAGE_TAR=FILE checks that image (built elsewhere) instead of building one.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
[[ $EUID -eq 0 ]] || skip "chroot needs root"
WORK=$(mktemp -d /var/tmp/kiln-e2e-gpu-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/rootfs

t0=$SECONDS
if [[ -n ${KILN_E2E_GPU_IMAGE_TAR:-} ]]; then  # an image built elsewhere, checked as it is
  ln -s "$(readlink -f "$KILN_E2E_GPU_IMAGE_TAR")" "$WORK/kiln-agent-gpu.tar"
  t1=$SECONDS t2=$SECONDS
else
  "$REPO/scripts/ensure/onnxruntime-gpu.sh" >/dev/null || fail "fetching the GPU libraries"
  t1=$SECONDS
  kiln_gpu_image_tar "$WORK" || fail "building the GPU agent image"
  t2=$SECONDS
  echo "== fetch $((t1 - t0))s, build $((t2 - t1))s"
fi

echo "== unpack the layers in order"
mkdir -p "$WORK/oci" "$ROOT"
tar -xf "$WORK/kiln-agent-gpu.tar" -C "$WORK/oci"
blob() { echo "$WORK/oci/blobs/sha256/${1#sha256:}"; }
manifest=$(blob "$(jq -r '.manifests[0].digest' "$WORK/oci/index.json")")
config=$(blob "$(jq -r '.config.digest' "$manifest")")
while read -r layer; do tar -xzf "$(blob "$layer")" -C "$ROOT"; done < <(jq -r '.layers[].digest' "$manifest")
packed=$(jq '[.layers[].size] | add' "$manifest")
unpacked=$(du -sb "$ROOT" | cut -f1)
echo "   $(jq '.layers | length' "$manifest") layers, $((packed / 1048576)) MiB compressed, $((unpacked / 1048576)) MiB unpacked" \
  "(libraries layer $(($(jq '.layers[0].size' "$manifest") / 1048576)) MiB compressed)"

IMAGE_ENV=$(jq -r '.config.Env[]' "$config")
grep -qx "ORT_DYLIB_PATH=$ORT_GPU_IN_IMAGE/libonnxruntime.so.1.31.1" <<<"$IMAGE_ENV" || fail "image Env: $IMAGE_ENV"
LIBPATH=$(sed -n 's/^LD_LIBRARY_PATH=//p' <<<"$IMAGE_ENV")
# The CUDA build of llama.cpp, when the image has it: its libraries on the search path too.
CUDA_LLAMA=0 want=$ORT_GPU_IN_IMAGE
compgen -G "$ROOT$LLAMA_IN_IMAGE/libggml-cuda.so*" >/dev/null && CUDA_LLAMA=1 want=$ORT_GPU_IN_IMAGE:$LLAMA_IN_IMAGE
[[ $LIBPATH == "$want" ]] || fail "image LD_LIBRARY_PATH: $LIBPATH, not $want"
echo "   llama.cpp in the image: $( ((CUDA_LLAMA)) && echo "the CUDA build ($(ls "$ROOT$LLAMA_IN_IMAGE" | tr '\n' ' '))" || echo "the CPU build (no KILN_E2E_CUDA_AGENT, no target/cuda/agent)")"
LOADER=/lib64/ld-linux-x86-64.so.2
[[ -e $ROOT$LOADER ]] || fail "no $LOADER in the image"

# Opened at run time, by name, so no DT_NEEDED lists them: ONNX Runtime's providers (from its own
# directory), cuDNN and the sub-libraries it opens, NVRTC (cuDNN's run-time compiled engines,
# cuBLASLt, the provider's own kernels) and the builtins NVRTC opens.
DLOPENED=(libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so libcudnn.so.9
  libcudnn_graph.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9 libcudnn_adv.so.9 libcudnn_heuristic.so.9
  libcudnn_engines_precompiled.so.9 libcudnn_engines_runtime_compiled.so.9 libnvrtc.so.13
  libnvrtc-builtins.so.13.0)
# The loader's own directories, searched after LD_LIBRARY_PATH.
IFS=: read -r -a SEARCH <<<"$LIBPATH"
SEARCH+=(/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /lib /usr/lib)

# in_image CMD...: CMD inside the unpacked image (chroot) with only the image's environment.
CHROOT=$(command -v chroot)
in_image() { env -i "${IMAGE_ENV_ARR[@]}" "$CHROOT" "$ROOT" "$@"; }
mapfile -t IMAGE_ENV_ARR <<<"$IMAGE_ENV"

# The loader's --list stops at the first library it cannot find, so libcuda.so.1 (which the
# NVIDIA container runtime mounts) is stood in for by an empty library of that name, outside the
# image's own directories and used by the listing only.
STUB=/tmp/kiln-e2e-libcuda-stub
mkdir -p "$ROOT$STUB"
echo | gcc -shared -x c - -o "$ROOT$STUB/libcuda.so.1" -Wl,-soname,libcuda.so.1 || fail "gcc: the libcuda.so.1 stand-in"

# check_libraries: prints one line per unresolved library (FILE: what the loader said); fails when any.
check_libraries() {
  local bad=0 f so d found out
  local files=(/bin/kiln-agent)
  while read -r f; do
    [[ $(head -c4 "$f") == $'\x7fELF' ]] && files+=("${f#"$ROOT"}")
  done < <(find "$ROOT/usr/lib/onnxruntime" "$ROOT/lib" "$ROOT/usr/lib" -type f -name '*.so*' ! -name 'ld-linux*' 2>/dev/null | sort -u)
  for so in "${DLOPENED[@]}"; do
    found=
    for d in "${SEARCH[@]}"; do [[ -e $ROOT$d/$so ]] && { found=$d/$so; break; }; done
    if [[ -z $found ]]; then echo "dlopen: $so not found on the image's search path"; bad=1; fi
  done
  for f in "${files[@]}"; do
    out=$(in_image "$LOADER" --library-path "$LIBPATH:$STUB" --list "$f" 2>&1) || true
    # Every line must be a library resolved inside the image (the stand-in only for libcuda.so.1)
    # or the vDSO; anything else (not found, a loader error, no loader at all) is a failure.
    while read -r line; do
      echo "$f: $line"; bad=1
    done < <(grep -vE '^\s+(\S+ => )?/\S+ \(0x[0-9a-f]+\)$|^\s+linux-vdso\.so\.1 \(0x[0-9a-f]+\)$' <<<"$out")
    [[ $f == */libc.so.6 ]] || grep -q 'libc.so.6 => /' <<<"$out" || { echo "$f: the image's loader did not list it"; bad=1; }
  done
  echo "   checked ${#files[@]} ELF files and ${#DLOPENED[@]} libraries opened at run time"
  return "$bad"
}

echo "== every library resolves inside the image (libcuda.so.1 aside)"
check_libraries || fail "libraries missing from the image (above)"
in_image "$LOADER" --library-path "$LIBPATH:$STUB" --list "$ORT_GPU_IN_IMAGE/libonnxruntime_providers_cuda.so" |
  sed "s/ (0x.*//; s|$STUB/libcuda.so.1|(the node's driver)|; s/^/   /"

echo "== and the check fails when one is missing"
removable=("$ORT_GPU_IN_IMAGE/libcublasLt.so.13" "$ORT_GPU_IN_IMAGE/libcudnn_engines_precompiled.so.9")
((CUDA_LLAMA)) && removable+=("$(cd "$ROOT" && compgen -G "${LLAMA_IN_IMAGE#/}/libggml-cuda.so*" | sed 's|^|/|;q')")
for path in "${removable[@]}"; do
  lib=${path##*/}
  mv "$ROOT$path" "$WORK/removed"
  out=$(check_libraries 2>&1) && fail "check passed without $lib"
  grep -q "$lib" <<<"$out" || fail "check without $lib does not name it: $out"
  echo "   without $lib: $(grep -c "$lib" <<<"$out") unresolved, e.g. $(grep -m1 "$lib" <<<"$out")"
  mv "$WORK/removed" "$ROOT$path"
done
rm -r "${ROOT:?}$STUB"

# in_image_proc CMD...: in_image with /proc, /sys and /dev of this machine (a private mount
# namespace, gone with the command), as a container sees them.
in_image_proc() {
  unshare -m bash -c 'for d in proc sys dev; do mount --rbind "/$d" "$0/$d"; done; exec "$@"' \
    "$ROOT" env -i "${IMAGE_ENV_ARR[@]}" "$CHROOT" "$ROOT" "$@"
}

echo "== kiln-agent probe in the image: ONNX Runtime loaded, no GPU here"
in_image_proc /bin/kiln-agent probe >"$WORK/probe.json" 2>"$WORK/probe.err" || { cat "$WORK/probe.err" >&2; fail "probe"; }
jq -e '.hardware.runtimes.onnxruntime == "1.31.1"' "$WORK/probe.json" >/dev/null ||
  fail "probe in the GPU image reports no ONNX Runtime 1.31.1: $(jq -c .hardware.runtimes "$WORK/probe.json")"
jq -e '.hardware.accelerators | length == 0' "$WORK/probe.json" >/dev/null || fail "probe found a GPU on a machine without one"
echo "   runtimes $(jq -c .hardware.runtimes "$WORK/probe.json"), accelerators: none ($(jq -r '.hardware.acceleratorNote // ""' "$WORK/probe.json" | cut -c1-100))"

echo "== kiln-agent local in the image: the example on the GPU build's CPU provider, a CUDA target refused"
W=$ROOT/tmp/w
mkdir -p "$W"
cp "$REPO/examples/squeezenet/model.onnx" "$REPO/examples/squeezenet/fixture-v1.safetensors" "$W/"
target() { # target NAME BACKEND-FLOW: the example's ModelArtifact and an onnxruntime target
  awk '/^---/{exit} {print}' "$REPO/examples/squeezenet/kiln.yaml"
  cat <<YAML
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: $1}
spec:
  modelRef: {name: squeezenet}
  backend: $2
  profiles: [{name: batch1, dims: {batch: 1}}]
  warmup: {iterations: 5, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}
YAML
}
target ort-cpu '{kind: onnxruntime, executionProvider: cpu}' >"$W/cpu.yaml"
target ort-cuda '{kind: onnxruntime, executionProvider: cuda}' >"$W/cuda.yaml"
in_image_proc /bin/kiln-agent local /tmp/w/cpu.yaml --store /tmp/w/store --output json >"$WORK/cpu.json" 2>"$WORK/cpu.err" ||
  { tail -5 "$WORK/cpu.err" >&2; fail "local on the CPU provider: $(tail -1 "$WORK/cpu.json")"; }
tail -1 "$WORK/cpu.json" | jq -e '.ready and .placement.requested == "cpu" and .placement.nodes.cpu > 0' >/dev/null ||
  fail "CPU provider outcome: $(tail -1 "$WORK/cpu.json")"
echo "   cpu: $(tail -1 "$WORK/cpu.json" | jq -c '{ready, placement: .placement.nodes, parityMaxAbsError, p50Seconds}')"
rc=0
in_image_proc /bin/kiln-agent local /tmp/w/cuda.yaml --store /tmp/w/store --output json >"$WORK/cuda.json" 2>"$WORK/cuda.err" || rc=$?
((rc != 0)) || fail "a CUDA target was ready without a GPU: $(tail -1 "$WORK/cuda.json")"
tail -1 "$WORK/cuda.json" | jq -e '(.ready | not) and .reason == "IncompatibleRuntime"' >/dev/null ||
  { tail -5 "$WORK/cuda.err" >&2; fail "CUDA target without a driver: exit $rc, $(tail -1 "$WORK/cuda.json")"; }
# ONNX Runtime's own dlopen of the provider got as far as the driver: everything else it links
# was found in the image.
tail -1 "$WORK/cuda.json" | jq -e '.message | test("libcuda\\.so\\.1: cannot open")' >/dev/null ||
  fail "the CUDA provider failed to load for another reason than the missing driver: $(tail -1 "$WORK/cuda.json" | jq -r .message)"
echo "   cuda: $(tail -1 "$WORK/cuda.json" | jq -r '.reason + ": " + (.message | sub(".*with error: "; "") | gsub("\\n"; " ") | .[0:120])')"
echo "== GGUF on llama.cpp in the image: the CPU Ready, CUDA refused for this image's reason"
cp "$REPO/examples/tiny-llama/model.gguf" "$REPO/examples/tiny-llama/fixture-v1.safetensors" "$W/"
llama_target() { # llama_target NAME PROVIDER: the tiny llama's example with that provider
  sed -n '/^---/q;p' "$REPO/examples/tiny-llama/kiln.yaml"
  sed -n '/^---/,$p' "$REPO/examples/tiny-llama/kiln.yaml" |
    sed "s/name: tiny-llama-q8/name: $1/; s/kind: llamacpp/kind: llamacpp\n    executionProvider: $2/"
}
llama_target llama-cpu cpu >"$W/llama-cpu.yaml"
llama_target llama-cuda cuda >"$W/llama-cuda.yaml"
in_image_proc /bin/kiln-agent local /tmp/w/llama-cpu.yaml --store /tmp/w/store --output json >"$WORK/lcpu.json" 2>"$WORK/lcpu.err" ||
  { tail -5 "$WORK/lcpu.err" >&2; fail "tiny llama on the CPU: $(tail -1 "$WORK/lcpu.json")"; }
tail -1 "$WORK/lcpu.json" | jq -e .ready >/dev/null || fail "tiny llama on the CPU: $(tail -1 "$WORK/lcpu.json")"
echo "   cpu: $(tail -1 "$WORK/lcpu.json" | jq -c '{ready, parityMaxAbsError, p50Seconds}')"
rc=0
in_image_proc /bin/kiln-agent local /tmp/w/llama-cuda.yaml --store /tmp/w/store --output json >"$WORK/lcuda.json" 2>"$WORK/lcuda.err" || rc=$?
((rc != 0)) || fail "a CUDA GGUF target was ready without a GPU: $(tail -1 "$WORK/lcuda.json")"
if ((CUDA_LLAMA)); then
  want='(.ready | not) and .reason == "IncompatibleHardware" and (.message | test("needs an NVIDIA GPU"))'
else
  want='(.ready | not) and .reason == "IncompatibleRuntime" and (.message | test("no CUDA backend"))'
fi
tail -1 "$WORK/lcuda.json" | jq -e "$want" >/dev/null ||
  { tail -5 "$WORK/lcuda.err" >&2; fail "CUDA GGUF target: exit $rc, $(tail -1 "$WORK/lcuda.json")"; }
echo "   cuda: $(tail -1 "$WORK/lcuda.json" | jq -r '.reason + ": " + (.message | .[0:140])')"
echo "image: $((packed / 1048576)) MiB compressed, $((unpacked / 1048576)) MiB unpacked; fetch $((t1 - t0))s, build $((t2 - t1))s"
