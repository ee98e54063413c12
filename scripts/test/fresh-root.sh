#!/usr/bin/env bash
# Runs both README commands in a clean root, so that a missing install step cannot hide behind
# what a developer's machine happens to have. Not part of scripts/test.sh (a cold build: about an
# hour on the 2-core machine); run it when a change adds a native dependency. Needs root.
#
#   scripts/test/fresh-root.sh [--dir DIR] [--keep] [--with-e2e]
#
# The root: a minimal Debian of this machine's release (debootstrap --variant=minbase from the
# Debian archive this machine's apt uses), plus what a fresh machine of the project's kind ships
# that a build or test could pick up (FRESH_MACHINE below: its compilers, cmake, Python, git,
# curl, and libclang-cpp14, the decoy that once fooled a glob into "libclang is installed").
# Nothing more: every other package must come from scripts/ensure-packages.sh, run by the
# commands themselves. What the workplace sets up on every machine for its network comes along:
# the extra CA certificates, /etc/pip.conf, /opt/wheels, and the certificate, proxy and pip
# variables of this environment. The host's Rust toolchain (rustup home and cargo's bin), Go and Python are
# bind-mounted read-only at their own paths (a fresh machine has them installed the same way);
# CARGO_HOME inside is empty (no registry, no git checkouts, no build cache), and the repository
# is a fresh clone of this repository's HEAD (commit first what should be checked).
#
# Then, in the root, as root, with CI=true and nothing but the variables a login shell sets:
#   1. scripts/local.sh                     (README command 1) must end READY
#   2. bash scripts/test.sh                 (README command 2) with KILN_SKIP_E2E=1: the e2e
#      cluster is not started in the root (it takes a fixed network namespace, state and cache
#      directories and cgroups of the host, which one cluster per machine already holds); pass
#      --with-e2e to run it there anyway (only where no other cluster runs).
# Each command's result and wall time are printed and kept in DIR/report.txt, logs beside it.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=fresh-root-check

# Of a fresh machine's Debian packages (the image lists them), those a kiln build or test could
# use. The image also ships Java, Node.js, Docker's client and more, which nothing here calls.
FRESH_MACHINE=ca-certificates,curl,git,gcc,g++,make,libc6-dev,cmake,ninja-build,pkg-config,libssl-dev,python3,python3-pip,python3-venv,python3-yaml,xz-utils,jq,iproute2,openssl,procps,libclang-cpp14,file,unzip

dir=/var/tmp/kiln-fresh-root keep=0 e2e=0
while (($#)); do
  case $1 in
    --dir) dir=${2:?--dir needs a directory}; shift ;;
    --keep) keep=1 ;;
    --with-e2e) e2e=1 ;;
    *) sed -n '2,8s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
  shift
done
[[ $EUID -eq 0 ]] || die "needs root (debootstrap, chroot, mounts)"
"$REPO/scripts/ensure-packages.sh" fresh

root=$dir/root
report=$dir/report.txt
. /etc/os-release
[[ $ID == debian && -n ${VERSION_CODENAME:-} ]] || die "this machine is not Debian ($PRETTY_NAME)"
mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}

# The toolchains, found the way a login shell on this machine finds them.
cargo_bin=$(dirname "$(command -v cargo)") || die "no cargo on PATH"
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
[[ -d $rustup_home/toolchains ]] || die "no rustup toolchains in $rustup_home"
go_root=$(go env GOROOT 2>/dev/null) || go_root=
py_prefix=$(python3 -c 'import sys; print(sys.prefix)')
commit=$(git -C "$REPO" rev-parse HEAD)

cleanup() {
  [[ $keep == 1 ]] || rm -rf --one-file-system "$root"
}
rm -rf --one-file-system "$root"
mkdir -p "$root"
trap cleanup EXIT
: >"$report"
say() { echo "fresh-root-check: $*" | tee -a "$report"; }

say "$(date -u +%FT%TZ) commit $commit, Debian $VERSION_CODENAME from $mirror, load $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$SECONDS
debootstrap --variant=minbase --include="$FRESH_MACHINE" "$VERSION_CODENAME" "$root" "$mirror" \
  >"$dir/debootstrap.log" 2>&1 || die "debootstrap failed; see $dir/debootstrap.log"
# The same archives as this machine's apt (security updates included), and its resolver.
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
  rm -f "$root/etc/apt/sources.list"
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The machine's network setup, which a fresh machine of this kind has too: its extra CA
# certificates (registries are reached through a TLS-inspecting proxy), pip's configuration.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >>"$dir/debootstrap.log" 2>&1
fi
[[ ! -f /etc/pip.conf ]] || cp /etc/pip.conf "$root/etc/pip.conf"
chroot "$root" apt-get update -q >>"$dir/debootstrap.log" 2>&1
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade >>"$dir/debootstrap.log" 2>&1
say "root made in $((SECONDS - t0))s ($(du -sh --one-file-system "$root" | cut -f1)); preinstalled: $FRESH_MACHINE"

git clone -q --no-hardlinks "$REPO" "$root/root/kiln"
git -C "$root/root/kiln" checkout -q --detach "$commit"

# mounts lists "SOURCE TARGET" pairs bind-mounted read-only at the same path in the root.
mounts="$rustup_home $rustup_home
$cargo_bin $cargo_bin
$py_prefix $py_prefix"
[[ -n $go_root ]] && mounts+="
$go_root $go_root"
[[ ! -d /opt/wheels ]] || mounts+="
/opt/wheels /opt/wheels"
# The machine's own variables for certificates, proxies and pip (not the developer's).
machine_env=()
while IFS= read -r var; do machine_env+=("$var=${!var}"); done < <(compgen -e |
  grep -E '^(SSL_CERT_(FILE|DIR)|CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|GIT_SSL_CAINFO|PIP_[A-Z_]+|(https?|no|HTTPS?|NO)_(proxy|PROXY))$' || true)
path="$cargo_bin:$py_prefix/bin${go_root:+:$go_root/bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# run NAME COMMAND: one README command in the root, in a private mount namespace (the mounts
# vanish with it), its output in DIR/NAME.log, its result and wall time in the report.
run() {
  local name=$1 cmd=$2 start=$SECONDS rc=0
  say "$name: $cmd (load before $(cut -d' ' -f1-3 /proc/loadavg))"
  unshare --mount --propagation private -- bash -c '
    set -euo pipefail
    root=$1 mounts=$2; shift 2
    mount -t proc proc "$root/proc"
    mount -t sysfs sys "$root/sys"
    mount --rbind /dev "$root/dev"
    while read -r src dst; do
      mkdir -p "$root$dst"
      mount --bind "$src" "$root$dst"
      mount -o remount,bind,ro "$root$dst"
    done <<<"$mounts"
    exec chroot "$root" "$@"' _ "$root" "$mounts" \
    env -i "${machine_env[@]}" HOME=/root USER=root LOGNAME=root PATH="$path" RUSTUP_HOME="$rustup_home" \
    CARGO_HOME=/root/.cargo LANG=C.UTF-8 TERM=dumb CI=true KILN_SKIP_E2E=$((1 - e2e)) \
    nice -n 10 bash -c "cd /root/kiln && $cmd" >"$dir/$name.log" 2>&1 || rc=$?
  say "$name: exit $rc after $((SECONDS - start))s (load after $(cut -d' ' -f1-3 /proc/loadavg)); last lines:"
  tail -n 5 "$dir/$name.log" | sed 's/^/    /' | tee -a "$report"
  return "$rc"
}

rc1=0 rc2=0
run command1 'scripts/local.sh' || rc1=$?
if [[ $rc1 == 0 ]] && ! tail -n 20 "$dir/command1.log" | grep -q "^READY"; then
  say "command1: exited 0 but printed no READY"
  rc1=1
fi
run command2 'bash scripts/test.sh' || rc2=$?
say "result: command 1 $([[ $rc1 == 0 ]] && echo passed || echo FAILED), command 2 $([[ $rc2 == 0 ]] && echo passed || echo FAILED)$([[ $e2e == 1 ]] || echo ' (e2e skipped)'), $((SECONDS - t0))s in all"
((rc1 == 0 && rc2 == 0))
