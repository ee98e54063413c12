#!/usr/bin/env bash
# The last mile for a GGUF language model on llama.cpp's own llama-server, on the real cluster:
# the chart (with the csi.kiln.dev node plugin) and a real pretrained model from PyPI (SmolLM2-135M
# Q4_1, scripts/ensure/llm-models.sh) with a chat fixture made by `kiln-agent fixtures --reference
# llamacpp --chat`; then, in the target's namespace with Pod Security "restricted" enforced, the
# README's llama-server Deployment (examples/serving/llama-server.yaml) on an image of
# llama-server built from source (scripts/ensure/llama-tools.sh, llama.cpp b11434, the release
# kiln links) and its Service. Asserts: the pod is never Ready before the node's row is Ready and
# the agent has checked its server (chat template, tokenizer, greedy tokens; the kiln.dev/warm
# message names the figures); a client through the Service gets the fixture's greedy tokens; a
# llama-server started with another chat template (--chat-template chatml) stays not Ready with
# ServingMismatch naming the template. Through the OpenAI-compatible API (kiln.dev/protocol:
# openai, examples/serving/openai-llama-server.yaml as written, with an API key from a Secret the
# chart lets the agent read): Ready with the figures; without the key ServingUnauthorized; with
# another chat template (llama2) ServingMismatch naming it; under a name the server does not list
# ServingMismatch; the key in no agent log. Prints apply → first serving pod Ready and the first
# completion through the Service after Ready against the p50 the agent measured.
#
# Skips, saying why, when llama-server is not built yet (about 25 minutes once on 2 cores:
# scripts/ensure/llama-tools.sh llama-server); the model needs PyPI once (required under CI).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/kiln-lib.sh"
kiln_test serving-llama
TARGET=smollm2
NETNS=kiln-e2e

LLAMA_SERVER=$("$REPO/scripts/ensure/llama-tools.sh" --cached llama-server) ||
  skip "llama-server is not built: scripts/ensure/llama-tools.sh llama-server builds it once"
if ! MODELS=$(bash "$REPO/scripts/ensure/llm-models.sh"); then
  [[ ${CI:-} != true ]] || die "the real language model is required under CI=true"
  skip "no real language model: scripts/ensure/llm-models.sh needs PyPI once"
fi
kiln_example_dirs "$WORK"
smollm2_fixture

kiln_fresh_crds
kiln_images "$WORK/images" || die "images"
LLAMA_IMAGE=e2e/llama-server:b11434
"$E2E_DIR/build-image" --name "$LLAMA_IMAGE" --out "$WORK/images/llama-server.tar" "$LLAMA_SERVER" >/dev/null ||
  die "llama-server image"
"$E2E_DIR/cluster" load-image "$WORK/images/llama-server.tar" >/dev/null || die "load llama-server image"
T0=$(date +%s.%N)
# The agent may read exactly one Secret: the OpenAI pods' API key.
kiln_up "$REL" "$NS" "$REPOSITORY" "$WORK" \
  --set "agent.servingSecrets[0].namespace=$NS" --set "agent.servingSecrets[0].name=llama-key" ||
  die "kiln did not come up"

echo "== SmolLM2-135M (PyPI) with a chat fixture; the compile Job runs before the namespace is restricted"
smollm2_target "$TARGET"

sed -e "s|IMAGE|$LLAMA_IMAGE|" -e "s|NAMESPACE|$NS|" -e "s|TARGET|$TARGET|g" "$REPO/examples/serving/llama-server.yaml" |
  sed 's|^          args: \[-m|          imagePullPolicy: Never\n          args: [-m|' >"$WORK/serving.yaml"
kubectl -n "$NS" apply -f "$WORK/serving.yaml" >/dev/null || die "the restricted namespace refused the llama-server Deployment"

echo "== never Ready before the row and the check through llama-server"
pod() { kubectl -n "$NS" get pods -l "app=$TARGET" -o json | jq '.items[0] // empty'; }
serving_ready pod "$T0"
p=$P message=$MESSAGE

echo "== a client through the Service gets the fixture's greedy tokens"
IP=$(kubectl -n "$NS" get svc "$TARGET" -o jsonpath='{.spec.clusterIP}')
check=$(ip netns exec "$NETNS" python3 "$REPO/e2e/testdata/llama_check.py" "$IP:8080" "$FIX" 8) ||
  die "llama-server through the Service: $check"
first_after_ready "$check" '{compared, match, text}'

echo "== a llama-server with another chat template stays not Ready"
gated_pod chatml "$TARGET" 'kiln.dev/protocol: llama-server, kiln.dev/port: "8080"' "$LLAMA_IMAGE" \
  '[-m, /model/artifact, --host, 0.0.0.0, --port, "8080", -c, "128", -np, "1", --no-webui, --chat-template, chatml]' \
  /health 8080 | kubectl -n "$NS" apply -f - >/dev/null || die "apply the chatml pod"
wait_for "another chat template: ServingMismatch" 180 bash -c \
  "[[ \$(kubectl -n '$NS' get pod chatml -o jsonpath='{.status.conditions[?(@.type==\"kiln.dev/warm\")].reason}') == ServingMismatch ]]"
msg=$(kubectl -n "$NS" get pod chatml -o jsonpath='{.status.conditions[?(@.type=="kiln.dev/warm")].message}')
[[ $msg == *"chat template"* ]] || die "chatml: the reason does not name the template: $msg"
[[ $(kubectl -n "$NS" get pod chatml -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') != True ]] ||
  die "a llama-server with another chat template is Ready"
echo "   chatml: $(cut -c1-200 <<<"$msg")"
kubectl -n "$NS" delete pod chatml --wait=false >/dev/null

echo "== the OpenAI-compatible API (kiln.dev/protocol: openai) with an API key, as examples/serving/openai-llama-server.yaml"
KEY=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
kubectl -n "$NS" create secret generic llama-key --from-literal=api-key="$KEY" >/dev/null || die "the key's Secret"
sed -e "s|IMAGE|$LLAMA_IMAGE|" -e "s|NAMESPACE|$NS|" -e "s|TARGET|$TARGET|g" -e "s|API_KEY_SECRET|llama-key|" \
  "$REPO/examples/serving/openai-llama-server.yaml" |
  sed 's|^          args: \[-m|          imagePullPolicy: Never\n          args: [-m|' >"$WORK/openai.yaml"
kubectl -n "$NS" apply -f "$WORK/openai.yaml" >/dev/null || die "the restricted namespace refused the OpenAI Deployment"
openai_pod() { kubectl -n "$NS" get pods -l "app=$TARGET-openai" -o json | jq '.items[0] // empty'; }
wait_for "the OpenAI pod Ready through its gate" 240 bash -c \
  "kubectl -n '$NS' get pods -l 'app=$TARGET-openai' -o json | jq -e '.items[0].status.conditions[]? | select(.type == \"Ready\" and .status == \"True\")' >/dev/null"
q=$(openai_pod)
msg=$(cond "$q" kiln.dev/warm message)
[[ $msg == *"requests through the server within tolerance"* ]] || die "openai: warm without a check through the server: $msg"
echo "   openai: $(cut -c1-220 <<<"$msg")"
# refused NAME REASON WANT ANNOTATIONS ARGS: a llama-server pod (the key in its environment) that
# must stay not Ready with REASON, its message holding WANT.
refused_pod() {
  gated_pod "$1" "$TARGET" "$4" "$LLAMA_IMAGE" "$5" /health 8080 |
    python3 -c 'import sys, yaml
d = yaml.safe_load(sys.stdin)
d["spec"]["containers"][0]["env"] = [{"name": "LLAMA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-key", "key": "api-key"}}}]
print(yaml.safe_dump(d))' | kubectl -n "$NS" apply -f - >/dev/null || die "apply $1"
  gate_refuses "$1" "$2" "$3" 180
}
ARGS='[-m, /model/artifact, --alias, '$TARGET', --host, 0.0.0.0, --port, "8080", -c, "128", -np, "1", --no-webui'
refused_pod nokey ServingUnauthorized "answered 401" "kiln.dev/protocol: openai, kiln.dev/port: \"8080\"" "$ARGS]"
refused_pod llama2 ServingMismatch "chat template" \
  "kiln.dev/protocol: openai, kiln.dev/port: \"8080\", kiln.dev/api-key-secret: llama-key" "$ARGS, --chat-template, llama2]"
refused_pod othername ServingMismatch "lists" \
  "kiln.dev/protocol: openai, kiln.dev/port: \"8080\", kiln.dev/api-key-secret: llama-key, kiln.dev/model-name: gpt-4" "$ARGS]"
kubectl -n "$NS" logs -l app.kubernetes.io/component=agent --tail=-1 | grep -qF "$KEY" &&
  die "the API key is in the agent's log"
echo "serving-llama: llama-server Ready only after the row and its own server's check, natively and through the OpenAI API; golden tokens through the Service"
