#!/usr/bin/env bash
# Every system prerequisite of every kiln build and test, in one list, each with its consumer,
# installed (idempotently, from Debian) when missing. Nothing else installs system packages.
#
#   scripts/ensure-packages.sh build   what `cargo build` of the workspace needs (README command 1)
#   scripts/ensure-packages.sh test    build + push + what the tests run (scripts/test.sh)
#   scripts/ensure-packages.sh e2e     test + what the real cluster runs and builds (e2e/cluster up)
#   scripts/ensure-packages.sh push    what scripts/push-images.sh needs (skopeo)
#   scripts/ensure-packages.sh fresh   what scripts/test/fresh-root.sh needs (debootstrap)
#   scripts/ensure-packages.sh --list  print the list (group, package, check, consumer)
#
# Each check asks the question the consumer's answer depends on: `dpkg -s PACKAGE` for a Debian
# package (not a glob over library directories: /usr/lib/x86_64-linux-gnu/libclang-cpp.so.14,
# which these machines ship, satisfies `libclang*.so*` but is no libclang bindgen can load),
# or, for what is not a Debian package, the exact lookup the consumer does.
# As root it installs what is missing (apt-get); as another user a missing `build` package is an
# error naming the apt-get command, a missing `test` or `e2e` one a warning (those tests say
# they skip, and the cluster needs root anyway). Nothing is done when everything is present.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
TOOL=ensure-packages

# group | Debian package | consumer (who fails without it)
LIST='
build|g++|llama-cpp-sys-2 build script: compiles llama.cpp (and cc-built C of ring)
build|gcc|cc crate (ring), cmake C compiler of llama.cpp, e2e static pause
build|make|cmake'"'"'s Unix Makefiles generator (llama-cpp-sys-2)
build|libc6-dev|every link of a Rust binary (crt1.o, libc.so), e2e static pause (libc.a)
build|cmake|llama-cpp-sys-2 build script (builds llama.cpp for backend llamacpp)
build|libclang-dev|bindgen in llama-cpp-sys-2 build script (loads /usr/lib/llvm-14/lib/libclang.so)
test|docker-registry|kiln-store OCI tests, kiln-agent bench-pull, e2e registry
test|apache2-utils|htpasswd: kiln-store registry basic-auth test
test|prometheus|promtool: metrics exposition tests of both components, e2e chart-render
test|curl|kiln-store registry tests, e2e health checks
test|openssl|node-agent tests (hostile HTTPS certificates), e2e PKI
test|python3|node-agent tests (tests/data/hostile_https.py, tests/secrets.rs), e2e/build-image
test|python3-pip|scripts/ensure-onnxruntime.sh and scripts/ensure/ (`python3 -m pip download`)
e2e|containerd|e2e/cluster: container runtime (containerd, ctr)
e2e|runc|e2e/cluster: containerd'"'"'s OCI runtime
e2e|iptables|e2e/cluster: kube-proxy, pod routing
e2e|conntrack|e2e/cluster: kube-proxy
e2e|util-linux|e2e/cluster: nsenter into the cluster network namespace
e2e|iproute2|e2e/cluster: ip netns, veth
e2e|jq|e2e tests (dynamic-image and others)
e2e|containernetworking-plugins|e2e/cluster: CNI bridge and host-local
e2e|python3-yaml|e2e tests reading YAML
e2e|busybox-static|e2e/tests/lib.sh: the static busybox copied into test images
push|skopeo|scripts/push-images.sh: copies the OCI image archives to a registry (scripts/test/push-images.sh, e2e kiln and registry tests)
fresh|debootstrap|scripts/test/fresh-root.sh: makes the clean Debian root
'

# Not Debian packages, checked where their consumer looks: the Rust toolchain (rustup; every
# command), Go >= 1.25 on PATH (e2e/lib/build.sh builds Kubernetes with it). A fresh machine of
# the project's kind has both.

group=${1:-}
case $group in
  build) want='build' ;;
  test) want='build|push|test' ;;
  e2e) want='build|push|test|e2e' ;;
  push) want='push' ;;
  fresh) want='fresh' ;;
  --list)
    while IFS='|' read -r g pkg consumer; do
      [[ -n $g ]] && printf '%-6s %-28s %s\n' "$g" "$pkg" "$consumer"
    done <<<"$LIST"
    exit 0 ;;
  *) die "usage: $0 build|test|e2e|push|fresh|--list" ;;
esac

installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

command -v dpkg-query >/dev/null || die "no dpkg: install the packages of \`$0 --list\` (group $group) by hand"
need=() needed_by=()
while IFS='|' read -r g pkg consumer; do
  [[ -n $g && $g =~ ^($want)$ ]] || continue
  installed "$pkg" && continue
  need+=("$pkg")
  needed_by+=("$pkg ($g: $consumer)")
done <<<"$LIST"
if [[ $group == e2e ]] && ! command -v go >/dev/null; then
  echo "ensure-packages: no go on PATH; e2e/cluster needs Go >= 1.25 to build Kubernetes" >&2
fi
((${#need[@]})) || exit 0

if [[ $EUID -ne 0 ]]; then
  printf 'ensure-packages: missing %s\n' "${needed_by[@]}" >&2
  msg="install them: sudo apt-get install --no-install-recommends ${need[*]}"
  # Without the build group nothing compiles; the test and e2e groups skip with a reason.
  for pkg in "${need[@]}"; do
    grep -q "^build|$pkg|" <<<"$LIST" && die "$msg"
  done
  echo "ensure-packages: $msg (the tests that need them say they skip)" >&2
  exit 0
fi
command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get"
echo "ensure-packages: installing ${need[*]}" >&2
apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
for pkg in "${need[@]}"; do installed "$pkg" || die "$pkg is still not installed after apt-get"; done
