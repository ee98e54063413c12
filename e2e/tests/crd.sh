#!/usr/bin/env bash
# CRDs are applied, become Established, and the apiserver enforces their
# OpenAPI schema and CEL rules. Uses e2e/testdata/widget-crd.yaml always, and
# kiln's generated crds/*.yaml when they exist (ModelArtifact: spec.source.sha256
# must be 64 hex characters, checked on the first ModelArtifact in examples/ or
# testdata/modelartifact.yaml).
source "$(dirname "$0")/lib.sh"
test_namespace
REPO=$(cd "$E2E_DIR/.." && pwd)
HEX=$(printf 'kiln' | sha256sum | cut -c1-64)

establish() {
  local f=$1 names
  kubectl apply --server-side --force-conflicts -f "$f" >/dev/null
  names=$(kubectl create --dry-run=client -o name -f "$f")
  kubectl wait --for=condition=Established $names --timeout=30s >/dev/null || fail "$f not Established"
  echo "established: $(tr '\n' ' ' <<<"$names")"
}

# expect_reject WHY PATTERN: stdin must be refused with an error matching PATTERN.
expect_reject() {
  local out
  if out=$(kubectl -n "$TEST_NS" "$@" 2>&1); then fail "accepted, but should be rejected: $WHY"; fi
  grep -qiE "$PATTERN" <<<"$out" || fail "rejected for the wrong reason ($WHY): $out"
  echo "rejected as expected ($WHY)"
}

widget() { # NAME SHA REPLICAS MAX
  printf 'apiVersion: e2e.kiln.dev/v1alpha1\nkind: Widget\nmetadata: {name: %s}\nspec: {sha256: "%s", replicas: %s, maxReplicas: %s}\n' "$@"
}

establish "$E2E_DIR/testdata/widget-crd.yaml"
widget good "$HEX" 1 2 | kubectl -n "$TEST_NS" create -f - >/dev/null || fail "valid widget rejected"
echo "valid widget accepted"
WHY="sha256 not 64 hex" PATTERN='sha256.*should match' expect_reject create -f - < <(widget bad1 abc 1 2)
WHY="CEL replicas <= maxReplicas" PATTERN='replicas must not exceed maxReplicas' expect_reject create -f - < <(widget bad2 "$HEX" 3 2)
WHY="CEL immutability" PATTERN='sha256 is immutable' expect_reject \
  patch widget good --type=merge -p "{\"spec\":{\"sha256\":\"$(printf x | sha256sum | cut -c1-64)\"}}"
kubectl delete -f "$E2E_DIR/testdata/widget-crd.yaml" --wait=false >/dev/null

shopt -s nullglob
kiln_crds=("${KILN_E2E_CRD_DIR:-$REPO/crds}"/*.yaml)
if ((${#kiln_crds[@]} == 0)); then
  echo "no crds/*.yaml yet: kiln's own CRDs not exercised"
  exit 0
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
