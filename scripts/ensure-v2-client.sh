#!/usr/bin/env bash
# Installs the real Open Inference Protocol v2 client the serving tests talk to kiln-agent serve
# with: NVIDIA's `tritonclient[http]` from PyPI (and numpy), pinned, in a virtual environment kept
# outside the work tree ($KILN_CACHE_DIR/v2-client-<version>, default /var/cache/kiln as root,
# ~/.cache/kiln otherwise). Prints the environment's python. Idempotent: the question asked is
# whether that python imports the pinned versions; only then is nothing installed.
# Exit status 1, with the reason on stderr, when PyPI cannot be reached on first use.
#
#   scripts/ensure-v2-client.sh        # prints .../v2-client-2.73.0/bin/python
set -euo pipefail

TRITONCLIENT=2.73.0
NUMPY=2.4.6

if [[ -z ${KILN_CACHE_DIR:-} ]]; then
  if [[ $EUID -eq 0 ]]; then KILN_CACHE_DIR=/var/cache/kiln; else KILN_CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/kiln; fi
fi
venv=$KILN_CACHE_DIR/v2-client-$TRITONCLIENT
py=$venv/bin/python
check="import importlib.metadata as m, tritonclient.http, numpy; assert m.version('tritonclient') == '$TRITONCLIENT' and numpy.__version__ == '$NUMPY'"

if [[ -x $py ]] && "$py" -c "$check" 2>/dev/null; then
  echo "$py"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$KILN_CACHE_DIR"
python3 -m venv "$venv" >&2 || { echo "ensure-v2-client: python3 -m venv failed (Debian: python3-venv)" >&2; exit 1; }
"$py" -m pip install --quiet --disable-pip-version-check "tritonclient[http]==$TRITONCLIENT" "numpy==$NUMPY" >&2 \
  || { echo "ensure-v2-client: pip install tritonclient[http]==$TRITONCLIENT failed (PyPI is needed once)" >&2; exit 1; }
"$py" -c "$check" || { echo "ensure-v2-client: the installed client does not import" >&2; exit 1; }
echo "$py"
