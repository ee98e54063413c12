#!/usr/bin/env bash
# Installs (idempotently, from Debian) what the Rust tests need beyond the toolchain:
# docker-registry (the distribution registry, for kiln-store's OCI tests and bench-pull) and
# apache2-utils (htpasswd, bcrypt password files for the registry's basic-auth test) and
# prometheus (promtool, which checks both components' metrics exposition), and what the
# `llama-cpp-2` crate needs to build llama.cpp from source for kiln-agent's llamacpp backend: cmake,
# g++ and libclang (bindgen).
# Does nothing when everything is present; needs root (apt-get) only when something is missing.
set -euo pipefail

need=()
command -v docker-registry >/dev/null || [[ -x /usr/bin/docker-registry ]] || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
command -v curl >/dev/null || need+=(curl)
command -v promtool >/dev/null || need+=(prometheus)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || compgen -G '/usr/lib/*/libclang*.so*' >/dev/null ||
  need+=(libclang-dev)
((${#need[@]})) || exit 0
if [[ $EUID -ne 0 ]]; then
  echo "ensure-test-packages: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
  exit 0
fi
command -v apt-get >/dev/null || { echo "ensure-test-packages: missing ${need[*]} and no apt-get" >&2; exit 1; }
echo "ensure-test-packages: installing ${need[*]}" >&2
apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
