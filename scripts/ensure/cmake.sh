#!/usr/bin/env bash
# Installs CMake from PyPI (`cmake`, pinned) in a virtual environment of Debian's own Python kept
# outside the work tree ($KILN_CACHE_DIR/cmake-<version>), and prints its cmake's path.
#
# Why: the IREE runtime kiln-agent links (crates.io `eerie-sys`) is built by CMake 3.26 or newer,
# and Debian 12's is 3.25. Cargo finds this one through scripts/cargo-cmake.sh, which
# .cargo/config.toml names as CMAKE (a CMAKE already in the environment wins).
#
# Idempotent: the question asked is whether that cmake runs and names the pinned version; only
# then is nothing installed. Several builds at once: one installs, the others wait. About 5 s and
# 60 MB on first use; exit status 1, with the reason on stderr, when PyPI cannot be reached then.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-cmake

VERSION=3.31.10
PYTHON=/usr/bin/python3
venv=$(kiln_cache_dir)/cmake-$VERSION

installed() { "$venv/bin/cmake" --version 2>/dev/null | grep -qx "cmake version $VERSION"; }
kiln_once "$venv" installed "$venv/bin/cmake"
[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
pinned_venv "$venv" "$PYTHON" "import importlib.metadata as m; assert m.version('cmake') == '$VERSION'" "cmake==$VERSION"
installed || die "$venv/bin/cmake --version does not say $VERSION"
echo "$venv/bin/cmake"
