#!/usr/bin/env bash
# README command 1: kiln's main job on this machine, from a fresh clone. Installs the build's
# system packages when missing (scripts/ensure-packages.sh build: the one list that
# scripts/test.sh uses too), then builds kiln-agent (release) and runs `kiln-agent local` with
# the arguments given (none: the embedded default model) to READY or a classified failure.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
scripts/ensure-packages.sh build
exec cargo run --release --locked -p kiln-agent -- local "$@"
