#!/usr/bin/env bash
# Installs a second, independent OpenAI-compatible language-model server for kiln's `openai`
# check: llama-cpp-python's (`python -m llama_cpp.server`, FastAPI on Python bindings of
# llama.cpp), from its PyPI source distribution (pinned by sha256), which carries llama.cpp
# (ggml-org/llama.cpp@0c1e57098) and builds it with CMake. Its HTTP layer, chat templating
# (Jinja2 over the GGUF's template) and logprobs are its own, not llama-server's.
#
# A virtual environment of Debian's own Python (/usr/bin/python3, as scripts/ensure/kserve.sh)
# with every package pinned, the build backend included (scikit-build-core, no build isolation),
# kept outside the work tree in $KILN_CACHE_DIR/llama-cpp-python-<version> (default
# /var/cache/kiln as root, ~/.cache/kiln otherwise). llama.cpp is built for the CPU only, with
# the flags of a portable build (no -march=native, no OpenMP, no BLAS, no GPU backend, no tests,
# tools or examples, no multimodal library: kiln checks text) under `nice`, on
# $CMAKE_BUILD_PARALLEL_LEVEL (default $KILN_BUILD_JOBS, else every core) jobs; compile progress
# on stderr, pip's whole output in <venv>.log. About 7 minutes on a loaded 2-core machine, once
# (a 77 MB download, 140 compile steps); the environment holds 177 MB.
#
# Prints the environment's python on stdout. Idempotent: the question asked is whether that
# python imports the server with the pinned versions; only then is nothing built. The
# environment is built in a temporary directory and renamed into place when whole, under a lock,
# so concurrent runs build it once and none sees it half-installed. Exit status 1, with the
# reason on stderr, when PyPI cannot be reached on first use or the build fails.
#
#   scripts/ensure/llama-cpp-python.sh            # prints .../llama-cpp-python-0.3.36/bin/python
#   scripts/ensure/llama-cpp-python.sh --cached   # the same, or exit 3 if not installed (no build)
#
# The server then (flags are the settings' field names; HOST and PORT in the environment win
# over --host and --port):
#   PY -m llama_cpp.server --model M.gguf --model_alias NAME --host 127.0.0.1 --port P \
#     --n_ctx 256 --n_threads 1 --n_threads_batch 1 --flash_attn true [--api_key KEY]
# --flash_attn true because llama.cpp itself (llama-server, kiln's engine) chooses flash
# attention on the CPU and this server turns it off by default: SmolLM2-135M's greedy chat answer
# and first log-probability (by 0.1) differ between the two. A greedy request should also send
# `repeat_penalty: 1.0`: this server's default, 1.1, is applied before the greedy pick.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-llama-cpp-python

VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
PYTHON=/usr/bin/python3
# What pip resolved for llama-cpp-python[server]==0.3.36 on Python 3.11 (November 2026), every
# package pinned, so that a rebuild installs the same server.
PINS=(
  fastapi==0.165.0 uvicorn==0.54.0 sse-starlette==3.7.0 starlette-context==0.3.6
  pydantic-settings==2.16.3 jinja2==3.1.6 numpy==2.4.6 diskcache==5.6.3
  typing-extensions==4.16.0 pyyaml==6.0.4
  starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 anyio==4.16.0 click==8.5.1
  h11==0.16.0 markupsafe==3.0.4 idna==3.20 python-dotenv==1.2.4 annotated-types==0.8.0
  annotated-doc==0.0.7 typing-inspection==0.4.5 opentelemetry-api==1.45.2
)
BUILD_PINS=(scikit-build-core==1.1.2 packaging==26.4 pathspec==1.1.1)
CMAKE_FLAGS=(
  -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF
  -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_RPC=OFF -DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF
)

cached=0
[[ ${1:-} != --cached ]] || { cached=1; shift; }
(($# == 0)) || die "usage: scripts/ensure/llama-cpp-python.sh [--cached]"

cache=$(kiln_cache_dir)
venv=$cache/llama-cpp-python-$VERSION
check="import importlib.metadata as m, llama_cpp, llama_cpp.server.app
pins = '$VERSION ${PINS[*]}'.split()
bad = [p for p in pins[1:] if m.version(p.split('==')[0]) != p.split('==')[1]]
assert llama_cpp.__version__ == pins[0] and not bad, bad"
installed() { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "$check" 2>/dev/null; }

if installed; then
  echo "$venv/bin/python"
  exit 0
elif ((cached)); then
  echo "$TOOL: llama-cpp-python $VERSION is not installed; scripts/ensure/llama-cpp-python.sh builds it (about 7 minutes on 2 cores, once)" >&2
  exit 3
fi

mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9
# Another run may have installed it while this one waited for the lock.
if installed; then
  echo "$venv/bin/python"
  exit 0
fi
[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
for cmd in cmake make g++; do
  command -v "$cmd" >/dev/null || die "$cmd is missing: cmake, make and g++ are needed (scripts/ensure-packages.sh build installs them)"
done

tmp=$(mktemp -d "$cache/.llama-cpp-python-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
env_pip() { "$tmp/env/bin/python" -m pip --disable-pip-version-check --no-input "$@"; }
log=$venv.log
"$PYTHON" -m venv "$tmp/env" >&2 || die "$PYTHON -m venv failed (Debian: python3-venv)"
env_pip install --quiet "${BUILD_PINS[@]}" >&2 || die "pip install ${BUILD_PINS[*]} failed (PyPI is needed once)"
# Metadata is read with the pinned backend too: nothing unpinned is fetched.
env_pip download --quiet --no-deps --no-build-isolation --no-binary llama-cpp-python \
  "llama-cpp-python==$VERSION" -d "$tmp/sdist" >&2 ||
  die "pip download llama-cpp-python==$VERSION failed (PyPI is needed once)"
sdist=$tmp/sdist/llama_cpp_python-$VERSION.tar.gz
[[ -f $sdist && $(sha256_of "$sdist") == "$SDIST_SHA256" ]] || die "$sdist does not have the pinned sha256 $SDIST_SHA256"

echo "$TOOL: building llama.cpp for llama-cpp-python $VERSION (about 7 minutes on 2 cores, once; pip's output in $log)" >&2
# The wheel is not cached (--no-cache-dir): pip keys its cache by the sdist, not by CMAKE_ARGS.
# Ninja's "[done/total]" lines are the progress; every tenth of the way is shown.
CMAKE_ARGS="${CMAKE_FLAGS[*]}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-${KILN_BUILD_JOBS:-$(nproc)}} \
  nice -n 19 "$tmp/env/bin/python" -m pip --disable-pip-version-check --no-input install \
  --verbose --no-cache-dir --no-build-isolation "${sdist}[server]" "${PINS[@]}" 2>&1 |
  tee "$log" |
  awk -v tool="$TOOL" 'match($0, /\[[0-9]+\/[0-9]+\]/) {
      split(substr($0, RSTART + 1, RLENGTH - 2), n, "/")
      if (n[2] != total) { total = n[2]; shown = -10 }
      p = int(100 * n[1] / n[2])
      if (p >= shown + 10 || n[1] == n[2]) {
        printf "%s: compiling llama.cpp: %d%% (%d of %d)\n", tool, p, n[1], n[2] > "/dev/stderr"
        fflush("/dev/stderr")
        shown = p
      }
    }' ||
  die "pip install of llama-cpp-python $VERSION failed: the end of $log says why"

# A virtual environment names its own directory in its scripts (bin/pip's first line,
# bin/activate): make them name the place it is renamed to. Its python needs nothing (bytecode
# takes its file names from where it is loaded).
{ grep -lIF -- "$tmp/env" "$tmp/env/bin/"* || true; } | while read -r f; do sed -i "s|$tmp/env|$venv|g" "$f"; done
"$tmp/env/bin/python" -c "$check" || die "the installed packages do not import with the pinned versions"
rm -rf "$venv"
mv -T "$tmp/env" "$venv"
"$venv/bin/python" -c "$check" || die "$venv does not import after the rename"
echo "$venv/bin/python"
