#!/usr/bin/env bash
# The Helm built alongside the cluster installs, upgrades and uninstalls a chart.
source "$(dirname "$0")/lib.sh"
test_namespace

[[ $(helm version --template '{{.Version}}') == "$HELM_VERSION" ]] || fail "helm is not $HELM_VERSION"
chart=$(mktemp -d)
trap 'rm -rf "$chart"; kubectl delete namespace "$TEST_NS" --wait=false >/dev/null 2>&1 || true' EXIT
mkdir -p "$chart/templates"
printf 'apiVersion: v2\nname: probe\nversion: 0.1.0\n' >"$chart/Chart.yaml"
printf 'word: first\n' >"$chart/values.yaml"
cat >"$chart/templates/cm.yaml" <<'YAML'
apiVersion: v1
kind: ConfigMap
metadata: {name: {{ .Release.Name }}-probe}
data: {word: {{ .Values.word | quote }}}
YAML
helm install probe "$chart" -n "$TEST_NS" --wait >/dev/null
[[ $(kubectl -n "$TEST_NS" get cm probe-probe -o jsonpath='{.data.word}') == first ]] || fail "install"
helm upgrade probe "$chart" -n "$TEST_NS" --set word=second >/dev/null
[[ $(kubectl -n "$TEST_NS" get cm probe-probe -o jsonpath='{.data.word}') == second ]] || fail "upgrade"
helm uninstall probe -n "$TEST_NS" >/dev/null
kubectl -n "$TEST_NS" get cm probe-probe >/dev/null 2>&1 && fail "uninstall left the configmap"
echo "helm $HELM_VERSION install/upgrade/uninstall ok"
