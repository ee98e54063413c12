#!/usr/bin/env bash
# Installs what kiln's IREE engine compiles with, pinned, in a virtual environment
# of Debian's own Python (/usr/bin/python3) kept outside the work tree
# ($KILN_CACHE_DIR/iree-<version>, default /var/cache/kiln as root, ~/.cache/kiln otherwise):
#
# * IREE's compiler, PyPI `iree-base-compiler` (`iree-import-onnx`, `iree-compile`), with `onnx`
#   for the importer: what a compile Job runs. Its runtime is built into kiln-agent from
#   crates.io (`eerie-sys`, the same IREE commit, 89ece87b), not taken from here.
# (The CMake that builds that runtime is scripts/ensure/cmake.sh's.)
#
# Prints the environment's bin directory. Idempotent: the question asked is whether its python
# imports the pinned versions and `iree-compile --version` names its own; only
# then is nothing installed. About 15 s and 640 MB on first use; exit status 1, with the reason
# on stderr, when PyPI cannot be reached then.
#
#   scripts/ensure/iree.sh        # prints .../iree-3.13.0/bin
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-iree

IREE=3.13.0
ONNX=1.23.2
PYTHON=/usr/bin/python3

venv=$(kiln_cache_dir)/iree-$IREE
check="import importlib.metadata as m, onnx, iree.compiler; assert m.version('iree-base-compiler') == '$IREE' and onnx.__version__ == '$ONNX'"

[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
pinned_venv "$venv" "$PYTHON" "$check" "iree-base-compiler==$IREE" "onnx==$ONNX"
"$venv/bin/iree-compile" --version 2>&1 | grep -q "IREE compiler version $IREE" ||
  die "$venv/bin/iree-compile --version does not say $IREE"
echo "$venv/bin"
