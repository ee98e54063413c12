#!/usr/bin/env bash
# kiln's generated CRDs (charts/kiln/files/crds/*.yaml, or $KILN_E2E_CRD_DIR) are accepted by a
# real apiserver (schema and CEL cost checks happen only there) and become
# Established; ModelArtifact refuses a spec.source.sha256 that is not 64
# lowercase hex characters and refuses changing the source. The object comes
# from the first ModelArtifact in examples/, else testdata/modelartifact.yaml.
source "$(dirname "$0")/lib.sh"
test_namespace
source "$(dirname "$0")/crd-lib.sh"

shopt -s nullglob
kiln_crds=("${KILN_E2E_CRD_DIR:-$REPO/charts/kiln/files/crds}"/*.yaml)
if ((${#kiln_crds[@]} == 0)); then
  skip "no charts/kiln/files/crds/*.yaml yet"
fi
for f in "${kiln_crds[@]}"; do establish "$f"; done

# ModelArtifact: take a valid example (examples/ or e2e/testdata/), then break its digest.
sample=
for f in "$REPO"/examples/*.yaml "$REPO"/examples/*/*.yaml "$E2E_DIR"/testdata/modelartifact*.yaml; do
  if grep -q '^kind: ModelArtifact' "$f"; then sample=$f; break; fi
done
if [[ -z $sample ]]; then
  kubectl get crd modelartifacts.kiln.dev >/dev/null 2>&1 &&
    fail "ModelArtifact CRD present but no ModelArtifact example to validate against"
  exit 0
fi
obj=$(kubectl create --dry-run=client -o json -f "$sample" |
  jq -c 'if .kind == "List" then .items[] else . end | select(.kind == "ModelArtifact")' | head -n1)
obj=$(jq --arg ns "$TEST_NS" --arg hex "$HEX" '.metadata.namespace = $ns | .spec.source.sha256 = $hex' <<<"$obj")
kubectl create -f - <<<"$obj" >/dev/null || fail "valid ModelArtifact from $sample rejected"
echo "valid ModelArtifact (from ${sample#"$REPO"/}) accepted"
for bad in abc "${HEX^^}" "${HEX}00" "${HEX:0:63}g"; do
  WHY="ModelArtifact sha256 '$bad'" PATTERN='sha256' expect_reject create -f - \
    < <(jq --arg bad "$bad" '.metadata.name += "-bad" | .spec.source.sha256 = $bad' <<<"$obj")
done
# The source is content: changing its digest on an existing object is refused.
name=$(jq -r .metadata.name <<<"$obj")
WHY="ModelArtifact spec.source is immutable" PATTERN='source' expect_reject \
  patch modelartifact "$name" --type=merge -p "{\"spec\":{\"source\":{\"sha256\":\"$(printf y | sha256sum | cut -c1-64)\"}}}"

# Fixture versions: adding one is fine, rewriting one is refused.
kubectl -n "$TEST_NS" patch modelartifact "$name" --type=json -p \
  "[{\"op\":\"add\",\"path\":\"/spec/fixtures/-\",\"value\":{\"version\":\"v2\",\"uri\":\"file://f2.safetensors\",\"sha256\":\"$HEX\"}}]" \
  >/dev/null || fail "adding a fixture version was refused"
echo "adding fixture version v2 accepted"
WHY="rewriting fixture v1" PATTERN='fixture versions are immutable' expect_reject \
  patch modelartifact "$name" --type=json -p "[{\"op\":\"replace\",\"path\":\"/spec/fixtures/0/sha256\",\"value\":\"$(printf z | sha256sum | cut -c1-64)\"}]"
# A symbolic dim needs min <= max.
WHY="dim with min > max" PATTERN='min <= max' expect_reject create -f - \
  < <(jq '.metadata.name += "-dims" | .spec.inputs[0].dims[0] = {symbol: "batch", min: 8, max: 1}' <<<"$obj")

# CompiledTarget: the example is accepted and shows useful columns; cross-field rules hold.
target=$(kubectl create --dry-run=client -o json -f "$sample" |
  jq -c 'if .kind == "List" then .items[] else . end | select(.kind == "CompiledTarget")' | head -n1)
if [[ -n $target ]]; then
  target=$(jq --arg ns "$TEST_NS" '.metadata.namespace = $ns' <<<"$target")
  kubectl create -f - <<<"$target" >/dev/null || fail "valid CompiledTarget from $sample rejected"
  echo "valid CompiledTarget accepted"
  # Not grep -q: it exits at the first match, kubectl gets SIGPIPE and pipefail fails the line.
  kubectl -n "$TEST_NS" get compiledtargets | grep 'MODEL.*BACKEND' >/dev/null || fail "printer columns missing"
  kubectl -n "$TEST_NS" get compiledtargets |
    grep "$(jq -r .spec.modelRef.name <<<"$target").*$(jq -r .spec.backend.kind <<<"$target")" >/dev/null ||
    fail "printer columns do not show model and backend"
  echo "kubectl get compiledtargets shows MODEL and BACKEND"
  WHY="fallback policy Class without class" PATTERN='fallback.class is required' expect_reject create -f - \
    < <(jq '.metadata.name += "-fb" | .spec.fallback = {policy: "Class"}' <<<"$target")
  WHY="unknown backend" PATTERN='backend.kind' expect_reject create -f - \
    < <(jq '.metadata.name += "-be" | .spec.backend.kind = "magic"' <<<"$target")
  WHY="exec backend without image" PATTERN='needs backend.image' expect_reject create -f - \
    < <(jq '.metadata.name += "-ex" | .spec.backend.kind = "exec"' <<<"$target")
  WHY="negative atol" PATTERN='atol' expect_reject create -f - \
    < <(jq '.metadata.name += "-tol" | .spec.warmup.defaultTolerance = {atol: -1, rtol: 0}' <<<"$target")
  WHY="no profiles" PATTERN='profiles' expect_reject create -f - \
    < <(jq '.metadata.name += "-np" | .spec.profiles = []' <<<"$target")
fi

# The bad-spec corpus (e2e/testdata/specs/), which node-agent/tests/specs.rs runs through local
# mode: each edit the corpus calls invalid is refused by this apiserver (server-side dry run,
# strict field validation as kubectl applies it), each valid one accepted. Same verdicts on both
# sides is the parity between `kiln-agent local` and the cluster.
corpus=$E2E_DIR/testdata/specs
mapfile -t base_docs < <(kubectl create --dry-run=client -o json -f "$corpus/base.yaml" |
  jq -c 'if .kind == "List" then .items[] else . end')
((${#base_docs[@]} == 2)) || fail "base.yaml: ${#base_docs[@]} documents"
n=0 wrong=()
while IFS= read -r case; do
  name=$(jq -r .name <<<"$case")
  kind=$(jq -r .doc <<<"$case")
  for d in "${base_docs[@]}"; do [[ $(jq -r .kind <<<"$d") == "$kind" ]] && doc=$d; done
  doc=$(jq -c --argjson c "$case" --arg ns "$TEST_NS" '
    reduce ($c.set // {} | to_entries[]) as $e (.; setpath($e.key | ltrimstr("/") | split("/") | map(tonumber? // .); $e.value))
    | reduce ($c.delete // [])[] as $p (.; delpaths([$p | ltrimstr("/") | split("/") | map(tonumber? // .)]))
    | .metadata.namespace = $ns' <<<"$doc")
  if out=$(kubectl apply --dry-run=server --validate=strict -f - <<<"$doc" 2>&1); then
    [[ $(jq -r '.valid // false' <<<"$case") == true ]] || wrong+=("$name: accepted by the apiserver")
  else
    [[ $(jq -r '.valid // false' <<<"$case") != true ]] || wrong+=("$name: refused: $out")
  fi
  n=$((n + 1))
done < <(jq -c '.cases[]' "$corpus/corpus.json")
((${#wrong[@]} == 0)) || fail "apiserver and corpus disagree:$(printf '\n  %s' "${wrong[@]}")"
echo "corpus: $n cases, same verdict from the apiserver as from local mode"
