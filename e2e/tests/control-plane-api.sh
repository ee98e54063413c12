#!/usr/bin/env bash
# `up --control-plane-only`: etcd and the apiserver alone serve the API (read,
# write, CRDs), and no node components run.
source "$(dirname "$0")/lib.sh"
source "$E2E_DIR/lib/procs.sh"

[[ $(cat "$STATE/mode") == control-plane-only ]] || fail "cluster is not in control-plane-only mode"
for c in kubelet containerd kube-scheduler kube-controller-manager kube-proxy; do
  alive "$c" && fail "$c runs in control-plane-only mode"
done
kubectl get --raw /readyz >/dev/null || fail "apiserver not ready"
kubectl -n default get service kubernetes >/dev/null
name=cp-$RANDOM
kubectl -n default create configmap "$name" --from-literal=k=v >/dev/null
[[ $(kubectl -n default get configmap "$name" -o jsonpath='{.data.k}') == v ]] || fail "configmap round trip"
kubectl -n default delete configmap "$name" >/dev/null
kubectl apply -f "$E2E_DIR/testdata/widget-crd.yaml" >/dev/null
kubectl wait --for=condition=Established crd/widgets.e2e.kiln.dev --timeout=30s >/dev/null || fail "CRD not Established"
echo "API served by etcd + kube-apiserver only"
