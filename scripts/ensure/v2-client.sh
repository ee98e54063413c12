#!/usr/bin/env bash
# Installs the real Open Inference Protocol v2 client the serving tests talk to kiln-agent serve
# with: NVIDIA's `tritonclient[http]` from PyPI (and numpy), pinned, in a virtual environment kept
# outside the work tree ($KILN_CACHE_DIR/v2-client-<version>, default /var/cache/kiln as root,
# ~/.cache/kiln otherwise). Prints the environment's python. Idempotent: the question asked is
# whether that python imports the pinned versions; only then is nothing installed.
# Exit status 1, with the reason on stderr, when PyPI cannot be reached on first use.
#
#   scripts/ensure/v2-client.sh        # prints .../v2-client-2.73.0/bin/python
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-v2-client

TRITONCLIENT=2.73.0
NUMPY=2.4.6

venv=$(kiln_cache_dir)/v2-client-$TRITONCLIENT
check="import importlib.metadata as m, tritonclient.http, numpy; assert m.version('tritonclient') == '$TRITONCLIENT' and numpy.__version__ == '$NUMPY'"

pinned_venv "$venv" python3 "$check" "tritonclient[http]==$TRITONCLIENT" "numpy==$NUMPY"
echo "$venv/bin/python"
