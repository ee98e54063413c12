#!/usr/bin/env bash
# kiln on a real NVIDIA GPU, for a machine lent by the `device` tool (or any GPU machine): what
# issue 15 asks to prove, as far as kiln implements it today.
#
#   e2e/gpu/prove.sh pack      here (no GPU needed): a stripped release kiln-agent and the example
#                              models into gpu-carry/ (git-ignored), for `run` with
#                              carry: ["gpu-carry"]
#   e2e/gpu/prove.sh run [OUT] on the GPU machine, from the repository root: finds the CUDA
#                              libraries inside the machine's Python environments (no download),
#                              then records into OUT (default $OUT or gpu-proof/):
#                                probe.json   kiln-agent probe: NVML product, memory, compute
#                                             capability, driver and CUDA versions, MIG mode, and
#                                             the GPU Feature Discovery labels kiln derives
#                                nvidia-smi.txt  the same facts from the driver's own tool, to compare
#                                local-*.json kiln-agent local on each example model (CPU engine)
#                              and prints a summary. Exits non-zero when a step fails.
#
# Not covered yet (kiln has no GPU engine): tract-cuda and ONNX Runtime's CUDA provider runs
# (GPU vs CPU load/warmup/p50/p99, device memory, partitions). The summary says so.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
CARRY=$ROOT/gpu-carry

pack() {
  cd "$ROOT"
  cargo build --release -p kiln-agent
  rm -rf "$CARRY"
  mkdir -p "$CARRY/models"
  strip -o "$CARRY/kiln-agent" target/release/kiln-agent
  cp -r examples/squeezenet "$CARRY/models/"
  du -sh "$CARRY"
}

# cuda_libs: the directories of the CUDA libraries pip installed beside PyTorch (nvidia-*-cu*
# wheels put them under site-packages/nvidia/*/lib), for LD_LIBRARY_PATH.
cuda_libs() {
  find / -xdev -path '*/site-packages/nvidia/*/lib' -type d 2>/dev/null | sort -u | paste -sd:
}

run() {
  local out=${1:-${OUT:-$ROOT/gpu-proof}} agent=$CARRY/kiln-agent fail=0
  [[ -x $agent ]] || { echo "no $agent: run 'e2e/gpu/prove.sh pack' on the build machine and carry gpu-carry" >&2; exit 2; }
  mkdir -p "$out"
  local libs
  libs=$(cuda_libs)
  echo "CUDA libraries: ${libs:-none found}" | tee "$out/cuda-libs.txt"
  export LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  { nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version,mig.mode.current --format=csv || true
    nvidia-smi | head -5 || true; } >"$out/nvidia-smi.txt" 2>&1

  echo "== probe"
  "$agent" probe >"$out/probe.json"
  jq '{accelerators: .hardware.accelerators, driver: .hardware.driverVersion, cuda: .hardware.cudaDriverVersion,
    labels: (.labels | with_entries(select(.key | startswith("nvidia.com/"))))}' "$out/probe.json" || cat "$out/probe.json"
  jq -e '.hardware.accelerators | length > 0' "$out/probe.json" >/dev/null ||
    { echo "FAIL: the probe found no GPU: $(jq -r .hardware.acceleratorNote "$out/probe.json")"; fail=1; }
  # nvidia-smi and the probe must agree on the driver and the product.
  local smi_driver
  smi_driver=$( (nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || true) | head -1 | tr -d " ")
  [[ -z $smi_driver || $smi_driver == "$(jq -r .hardware.driverVersion "$out/probe.json")" ]] ||
    { echo "FAIL: nvidia-smi says driver $smi_driver, the probe $(jq -r .hardware.driverVersion "$out/probe.json")"; fail=1; }

  echo "== kiln-agent local on the example models (CPU engine: kiln has no GPU engine yet)"
  local m
  for m in "$CARRY"/models/*/kiln.yaml; do
    local name
    name=$(basename "$(dirname "$m")")
    if "$agent" local "$m" --store "$out/store" --output json >"$out/local-$name.json" 2>"$out/local-$name.log"; then
      jq -c '{ready, class, loadSeconds, warmupSeconds, p50Seconds, p99Seconds, peakMemoryBytes, placement}' "$out/local-$name.json"
    else
      echo "FAIL: local $name: $(tail -1 "$out/local-$name.json")"; fail=1
    fi
  done

  echo "== not run (no GPU engine in kiln yet): tract-cuda, ONNX Runtime CUDA provider, GPU vs CPU timings,"
  echo "   device memory, partitions, a GPU artifact refused on another compute capability or an older driver"
  echo "   (that rule is unit-tested: pipeline::ready::tests::a_gpu_build_for_another_device_or_a_newer_driver_is_refused_before_load)"
  return "$fail"
}

case ${1:-} in
  pack) pack ;;
  run) shift; run "$@" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
