# shellcheck shell=bash
# What kiln's scripts share, sourced (never run) after the caller's `set -euo pipefail`:
#
#   . "$(dirname "$(readlink -f "$0")")/lib.sh"       # from scripts/
#   . "$(dirname "$(readlink -f "$0")")/../lib.sh"    # from scripts/ensure/, bench/, test/
#
#   REPO                  the repository root, absolute (set when sourced; nothing else runs then)
#   TOOL                  the name `die` prefixes: set it before calling die (default: $0's name)
#   die MESSAGE...        "TOOL: MESSAGE" on stderr, exit status 1
#   kiln_cache_dir        prints $KILN_CACHE_DIR, or its default: /var/cache/kiln as root,
#                         ${XDG_CACHE_HOME:-~/.cache}/kiln otherwise; where every fetched or built
#                         prerequisite is kept, outside the work tree
#   release_or_debug BIN  prints target/release/BIN when built, else target/debug/BIN (under
#                         $CARGO_TARGET_DIR when set)
#   sha256_of FILE        prints FILE's sha256, hex
#   free_port             prints a free TCP port on 127.0.0.1
#   argv_json ARG...      prints the ARGs as a JSON array: how scripts/bench/harness.py takes a
#                         command safely
#   pinned_venv VENV PYTHON CHECK REQUIREMENT...
#                         makes VENV a virtual environment of PYTHON holding the pinned
#                         REQUIREMENTs, unless its python already runs CHECK (Python asserting the
#                         pinned versions); pip's output on stderr; dies saying what failed
#
# Python scripts have their own copy of the cache default: scripts/gen/pinned_venv.py.

REPO=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

die() {
  echo "${TOOL:-${0##*/}}: $*" >&2
  exit 1
}

kiln_cache_dir() {
  if [[ -n ${KILN_CACHE_DIR:-} ]]; then
    echo "$KILN_CACHE_DIR"
  elif [[ $EUID -eq 0 ]]; then
    echo /var/cache/kiln
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/kiln"
  fi
}

# release_or_debug BIN: BIN built with the release profile, else the debug one, in
# $CARGO_TARGET_DIR; when that is unset, in the directory scripts/test.sh builds in
# (scripts/cargo-target-dir.sh) if it holds BIN, else $REPO/target. Without that middle step a
# benchmark run from a shell without CARGO_TARGET_DIR measured a stale debug build in target/.
release_or_debug() {
  local target=${CARGO_TARGET_DIR:-}
  if [[ -z $target ]]; then
    target=$("$REPO/scripts/cargo-target-dir.sh")
    [[ -x $target/release/$1 || -x $target/debug/$1 ]] || target=$REPO/target
  fi
  if [[ -x $target/release/$1 ]]; then echo "$target/release/$1"; else echo "$target/debug/$1"; fi
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

argv_json() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pinned_venv() {
  local venv=$1 python=$2 check=$3
  shift 3
  if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "$check" 2>/dev/null; then
    return 0
  fi
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" >&2 || die "$python -m venv failed (Debian: python3-venv)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2 ||
    die "pip install $* failed (PyPI is needed once)"
  "$venv/bin/python" -c "$check" || die "the installed packages do not import"
}

# kiln_once DIR INSTALLED PATH: prints PATH and exits when INSTALLED (a command asking the right
# question of the tool in DIR) succeeds; otherwise takes DIR's lock, held until the script exits,
# and asks again, so that of several runs at once one builds and the others wait and reuse.
kiln_once() {
  local dir=$1 installed=$2 path=$3
  if "$installed"; then
    echo "$path"
    exit 0
  fi
  mkdir -p "$(dirname "$dir")"
  exec 9>"$dir.lock"
  flock 9
  if "$installed"; then
    echo "$path"
    exit 0
  fi
}

# kiln_go_install DIR NAME MODULE VERSION SUM PACKAGE [LDFLAGS]: builds PACKAGE@vVERSION (in MODULE,
# whose go.sum hash must be SUM) into DIR/bin/NAME, DIR replaced whole, with SOURCES beside the
# binary. From the Go module proxy only ($KILN_GOPROXY, default https://proxy.golang.org; never
# `direct`), every module checked against the Go checksum database through it, with the Go on
# this machine (GOTOOLCHAIN=local, GOENV and GOWORK off) and CGO_ENABLED=0, -trimpath, -s -w and
# LDFLAGS: a static binary. Modules are kept in $(kiln_cache_dir)/go (shared by the Go-built
# tools); the build cache is this run's own and goes with it. Run under kiln_once's lock.
kiln_go_install() {
  local dir=$1 name=$2 module=$3 version=$4 want=$5 package=$6 ldflags="-s -w ${7:-}"
  local cache have tmp sum proxy=${KILN_GOPROXY:-https://proxy.golang.org}
  cache=$(kiln_cache_dir)
  have=$(go env GOVERSION)
  have=${have#go}
  tmp=$(mktemp -d "$cache/.$name-XXXXXX")
  # shellcheck disable=SC2064 # expanded now: $tmp is this function's
  trap "rm -rf '$tmp'" EXIT
  echo "$TOOL: building $name $version with go $have from $proxy (once; a minute or more)" >&2
  (
    export GOPATH=$cache/go GOMODCACHE=$cache/go/pkg/mod GOCACHE=$tmp/gocache GOBIN=$tmp/bin \
      GOPROXY=$proxy GOENV=off GOWORK=off GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" \
      CGO_ENABLED=0
    cd "$tmp"
    sum=$(go mod download -json "$module@v$version" 2>"$tmp/download.log" |
      python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Sum") or d.get("Error"))') || true
    [[ $sum == "$want" ]] ||
      die "go mod download $module@v$version from $proxy: ${sum:-failed: $(tail -3 "$tmp/download.log")} (wanted $want)"
    nice -n 10 go install -trimpath -ldflags "$ldflags" "$package@v$version" >&2 ||
      die "go install $package@v$version failed (the Go module proxy is needed once)"
  ) || exit 1
  [[ -x $tmp/bin/$name ]] || die "go install made no $tmp/bin/$name"
  mkdir -p "$tmp/new/bin"
  mv "$tmp/bin/$name" "$tmp/new/bin/$name"
  echo "$package@v$version $want go$have sha256:$(sha256_of "$tmp/new/bin/$name")" >"$tmp/new/SOURCES"
  rm -rf "$dir"
  mv -T "$tmp/new" "$dir"
  rm -rf "$tmp"
}

# kiln_need_go MIN WHAT: dies unless the go on PATH is MIN or newer (WHAT needs it).
kiln_need_go() {
  command -v go >/dev/null || die "go is missing (Go $1 or newer builds $2; https://go.dev/dl)"
  local have
  have=$(go env GOVERSION)
  have=${have#go}
  [[ $(printf '%s\n%s\n' "$1" "$have" | sort -V | head -1) == "$1" ]] ||
    die "go $have is older than $1, which $2 needs"
}
