#!/usr/bin/env bash
# The cmake that cargo's build scripts run (.cargo/config.toml sets CMAKE to this file): the
# pinned one scripts/ensure/cmake.sh installs on first use, so that a plain `cargo build` on a
# fresh machine builds IREE's runtime (eerie-sys needs CMake 3.26 or newer; Debian 12 has 3.25).
# The install's own output goes to stderr, which the build script shows only on failure.
set -euo pipefail
cmake=$("$(dirname "$(readlink -f "$0")")/ensure/cmake.sh")
exec "$cmake" "$@"
