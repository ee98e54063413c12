#!/usr/bin/env bash
# Installs the third-party Open Inference Protocol v2 server the e2e test serving-kserve puts in
# front of a kiln-verified ONNX artifact: KServe's ModelServer (`kserve` from PyPI) with ONNX
# Runtime (`onnxruntime`, the release kiln's agent image carries) and `onnx` (to read the graph),
# pinned, in a virtual
# environment of Debian's own Python (/usr/bin/python3, so that an image can carry the same
# interpreter and standard library) kept outside the work tree ($KILN_CACHE_DIR/kserve-<version>,
# default /var/cache/kiln as root, ~/.cache/kiln otherwise). Prints the environment's directory.
# Idempotent: the question asked is whether its python imports the pinned versions; only then is
# nothing installed. About 2 minutes and 520 MB on first use; exit status 1, with the reason on
# stderr, when PyPI cannot be reached then.
#
#   scripts/ensure/kserve.sh        # prints .../kserve-0.21.0
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-kserve

KSERVE=0.21.0
ONNXRUNTIME=1.31.1
ONNX=1.23.2
PYTHON=/usr/bin/python3

venv=$(kiln_cache_dir)/kserve-$KSERVE
check="import importlib.metadata as m, kserve, onnx, onnxruntime; assert m.version('kserve') == '$KSERVE' and onnxruntime.__version__ == '$ONNXRUNTIME' and onnx.__version__ == '$ONNX'"

[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
pinned_venv "$venv" "$PYTHON" "$check" "kserve==$KSERVE" "onnxruntime==$ONNXRUNTIME" "onnx==$ONNX"
echo "$venv"
