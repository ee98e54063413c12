# shellcheck shell=bash
# Sourced by the benchmarks that run the example or corpus models (backends.sh, corpus.sh,
# isolation.sh, iree-levels.sh); needs AGENT, WORK, ITER and REPO set (and CORPUS,
# scripts/ensure/models.sh, for `prepare`), and scripts/lib.sh sourced.
#
# prepare MODEL BACKEND...: WORK/MODEL with the model, its ONNX Runtime fixture and a spec per
# backend (WORK/MODEL/BACKEND.yaml, ITER warmup iterations).
prepare() {
  local m=$1 d=$WORK/$1 digest backend
  shift
  mkdir -p "$d"
  cp "$CORPUS/$m.onnx" "$d/"
  "$AGENT" fixtures --reference onnxruntime --fixture-version v1 --model "$d/$m.onnx" \
    --inputs "$CORPUS/$m-inputs.safetensors" --out "$d/$m-fixture-v1.safetensors" >"$d/fixtures.log" 2>&1 ||
    { cat "$d/fixtures.log" >&2; exit 1; }
  digest=$(sha256_of "$d/$m-fixture-v1.safetensors")
  for backend in "$@"; do
    sed -e "s/@FIXTURE_SHA256@/$digest/" -e "s/kind: tract/kind: $backend/" \
      -e "s/iterations: [0-9]*/iterations: $ITER/" "$REPO/node-agent/tests/data/corpus/$m.yaml" >"$d/$backend.yaml"
  done
}

# prepare_example BACKEND...: WORK/squeezenet laid out as `prepare` lays out a corpus model: the
# example SqueezeNet, its fixture and a spec per backend.
prepare_example() {
  local d=$WORK/squeezenet backend
  mkdir -p "$d"
  cp "$REPO/examples/squeezenet/"{model.onnx,fixture-v1.safetensors,kiln.yaml} "$d/"
  for backend in "$@"; do
    sed -e "s/kind: tract/kind: $backend/" -e "s/iterations: [0-9]*/iterations: $ITER/" "$d/kiln.yaml" >"$d/$backend.yaml"
  done
}
