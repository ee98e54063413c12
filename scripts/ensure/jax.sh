#!/usr/bin/env bash
# Installs JAX, pinned, in a virtual environment of Debian's own Python (/usr/bin/python3) kept
# outside the work tree ($KILN_CACHE_DIR/jax-<version>, default /var/cache/kiln as root,
# ~/.cache/kiln otherwise): what examples/magika-stablehlo/make.py exports a real pretrained
# model to StableHLO with (`jax.export`), and `onnx` to read its weights. Only that example and
# its test use it; kiln itself never runs JAX.
#
# Prints the environment's bin directory. Idempotent: the question asked is whether its python
# imports the pinned versions; only then is nothing installed. About 30 s and 820 MB on first
# use; exit status 1, with the reason on stderr, when PyPI cannot be reached then.
#
#   scripts/ensure/jax.sh        # prints .../jax-0.10.2/bin
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-jax

JAX=0.10.2
ONNX=1.23.2
NUMPY=2.4.6
PYTHON=/usr/bin/python3

venv=$(kiln_cache_dir)/jax-$JAX
check="import importlib.metadata as m, jax, onnx, numpy; assert (m.version('jax'), m.version('jaxlib'), onnx.__version__, numpy.__version__) == ('$JAX', '$JAX', '$ONNX', '$NUMPY')"

[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
pinned_venv "$venv" "$PYTHON" "$check" "jax[cpu]==$JAX" "jaxlib==$JAX" "onnx==$ONNX" "numpy==$NUMPY"
echo "$venv/bin"
