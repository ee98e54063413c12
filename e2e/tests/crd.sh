#!/usr/bin/env bash
# A CRD is applied, becomes Established, and the apiserver enforces its
# OpenAPI schema and CEL rules (e2e/testdata/widget-crd.yaml: the cluster's CRD
# machinery, independent of kiln's own CRDs, which tests/kiln-crds.sh covers).
source "$(dirname "$0")/lib.sh"
test_namespace
source "$(dirname "$0")/crd-lib.sh"

establish "$E2E_DIR/testdata/widget-crd.yaml"
widget good "$HEX" 1 2 | kubectl -n "$TEST_NS" create -f - >/dev/null || fail "valid widget rejected"
echo "valid widget accepted"
WHY="sha256 not 64 hex" PATTERN='sha256.*should match' expect_reject create -f - < <(widget bad1 abc 1 2)
WHY="CEL replicas <= maxReplicas" PATTERN='replicas must not exceed maxReplicas' expect_reject create -f - < <(widget bad2 "$HEX" 3 2)
WHY="CEL immutability" PATTERN='sha256 is immutable' expect_reject \
  patch widget good --type=merge -p "{\"spec\":{\"sha256\":\"$(printf x | sha256sum | cut -c1-64)\"}}"
kubectl delete -f "$E2E_DIR/testdata/widget-crd.yaml" --wait=false >/dev/null

