#!/usr/bin/env bash
# charts/kiln without a cluster: the real `helm lint` and `helm template` over the value
# combinations that change what is rendered; values.schema.json refusing bad values (an unknown
# pull policy or log format, a misspelt key, a negative count, a malformed digest) with the
# value's name; the rendered objects checked for what the chart promises (CRDs byte-equal to
# crdgen's and kept, flags and mounts per component, GPU access only when asked, the CSI plugin
# privileged and from its own image apart from the unprivileged agent, RBAC without secrets or
# wildcards, every values.yaml key commented); every env var one the binary reads; the alert
# rules through the real `promtool check rules`, naming only metrics the operator and agent
# register; the Grafana dashboard ConfigMap when asked; README.md's values table what
# scripts/check/chart-readme.py writes, with the defaults values.yaml holds. Needs `helm` and
# `promtool` on PATH and no cluster: e2e/test.sh runs it through `e2e/cluster run`, which puts
# the e2e helm on PATH.
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$E2E_DIR/.." && pwd)
CHART=$REPO/charts/kiln
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v promtool >/dev/null || fail "promtool missing (Debian package prometheus; e2e/cluster up installs it)"

helm lint --strict "$CHART" --set store.url=oci://registry.example:5000/kiln
out=$(helm lint --strict "$CHART" --set store.url=/s --set logFormat=text 2>&1) && fail "helm lint passed a logFormat the schema refuses"
grep -qF "at '/logFormat'" <<<"$out" || fail "helm lint does not name the bad logFormat: $out"
out=$(helm template kiln "$CHART" 2>&1) && fail "rendered without store.url"
[[ $out == *"store.url is required"* ]] || fail "no clear error without store.url: $out"
out=$(helm template kiln "$CHART" --set store.url=relative/dir 2>&1) && fail "accepted a relative store path"
[[ $out == *"expected oci://"* ]] || fail "no clear error for a bad store.url: $out"

t() { helm template kiln "$CHART" -n kiln-system "$@"; }
# refused WANT ARGS...: rendering with ARGS fails, and its error holds WANT (a fixed string, e.g.
# the schema's path of the bad value).
refused() {
  local want=$1 out; shift
  out=$(t --set store.url=/s "$@" 2>&1) && fail "rendered with $*"
  grep -qF -- "$want" <<<"$out" || fail "refusing $* does not say $want: $out"
}
# values.schema.json: a bad value is refused before anything renders, naming it.
refused "at '/agent/image/pullPolicy': value must be one of 'IfNotPresent', 'Always', 'Never'" --set agent.image.pullPolicy=Sometimes
refused "at '/csi/image/pullPolicy'" --set csi.image.pullPolicy=Sometimes
refused "at '/agent/gpu/image/pullPolicy'" --set agent.gpu.image.pullPolicy=always
refused "at '/logFormat'" --set logFormat=text
refused "at '/agent': additional properties 'imag' not allowed" --set agent.imag.pullPolicy=Never
refused "at '': additional properties 'agnet' not allowed" --set agnet.enabled=false
refused "at '/operator/replicas': minimum" --set operator.replicas=-1
refused "at '/compile/maxAttempts': minimum" --set compile.maxAttempts=0
refused "at '/agent/port': maximum" --set agent.port=70000
refused "at '/csi/image/tag': got number, want string" --set csi.image.tag=2
refused "at '/metrics/prometheusRule/failClosedFor'" --set metrics.prometheusRule.failClosedFor=10min
refused "at '/agent/cacheHostPath'" --set agent.cacheHostPath=var/cache
# A values file is held to the same schema as --set: a misspelt nested key there too.
printf 'operator:\n  leaderElection:\n    leasename: other\n' >"$WORK/misspelt.yaml"
refused "at '/operator/leaderElection': additional properties 'leasename' not allowed" -f "$WORK/misspelt.yaml"
refused "at '/store/mirrors/0/host': 'cache:5000' does not match" --set-json 'store.mirrors=[{"host": "cache:5000"}]'
refused "invalid propertyName 'r/kiln'" --set-json 'store.mirrors={"r/kiln": [{"host": "https://c"}]}'
# Mirrors, as a list (the store registry's) or keyed by registry, reach the operator and agents
# as the JSON kiln-agent and kiln-operator parse (store/src/oci/mirror.rs).
for mirrors in '[{"host":"http://cache:5000","capabilities":["pull"]}]' \
  '{"10.0.0.1:5000":[{"host":"http://cache:5000"}],"_default":[{"host":"https://hub-cache"}]}'; do
  env=$(t --set store.url=oci://10.0.0.1:5000/kiln --set-json "store.mirrors=$mirrors" |
    grep -A1 -- '- name: KILN_REGISTRY_MIRRORS' | sed -n 's/^ *value: //p' | sort -u)
  [[ $(jq -cS . <<<"$(jq -r . <<<"$env")") == "$(jq -cS . <<<"$mirrors")" ]] ||
    fail "store.mirrors $mirrors rendered as $env"
done
t --set store.url=/var/lib/kiln/store --set sources.hostPath=/srv/models >"$WORK/fs.yaml"
t --set store.url=oci://10.0.0.1:5000/kiln --set store.insecure=true --set store.existingSecret=regcred \
  --set agent.gpu.enabled=true --set agent.gpu.runtimeClassName=nvidia --set crds.keep=false \
  --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --set metrics.grafanaDashboard.enabled=true >"$WORK/oci.yaml"
t --set store.url=file:///data/kiln --set crds.enabled=false --set agent.enabled=false \
  --set operator.leaderElection.enabled=false --set metrics.service.enabled=false >"$WORK/min.yaml"
t --set store.url=/s --set attestation.enabled=false >"$WORK/unsigned.yaml"
t --set store.url=/s --set csi.enabled=false >"$WORK/nocsi.yaml"
t --set store.url=/s --set 'agent.servingSecrets[0].namespace=ml' --set 'agent.servingSecrets[0].name=vllm-key' \
  --set 'agent.servingSecrets[1].namespace=ml' --set 'agent.servingSecrets[1].name=tgi-key' \
  --set 'agent.servingSecrets[2].namespace=web' --set 'agent.servingSecrets[2].name=vllm-key' >"$WORK/secrets.yaml"
refused "at '/agent/servingSecrets/0'" --set 'agent.servingSecrets[0].name=k'
refused "at '/agent/servingSecrets/0/namespace'" --set 'agent.servingSecrets[0].namespace=ML' --set 'agent.servingSecrets[0].name=k'
t --set store.url=/s --set csi.kubeletDir=/data/kubelet >"$WORK/kubeletdir.yaml"
# One cache directory per node under a shared cacheHostPath.
t --set store.url=/s --set agent.cachePerNode=true |
  python3 -c 'import sys, yaml
ds = {d["metadata"]["name"]: d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "DaemonSet"}
sub = lambda n: [v for v in ds[n]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if v["name"] == "cache"][0].get("subPathExpr")
sys.exit(sub("kiln-agent") != "$(NODE_NAME)" or sub("kiln-csi") != "$(KILN_NODE_NAME)")' ||
  fail "agent.cachePerNode does not mount cacheHostPath/<node name> into the agent and the CSI plugin"
grep -q subPathExpr "$WORK/fs.yaml" && fail "subPathExpr without agent.cachePerNode"
t --set store.url=/s --set sourceSignatures.existingSecret=kiln-source-keys --set sourceSignatures.required=true >"$WORK/srcsig.yaml"
# The GPU split under a user's own required node affinity (two terms) and pull policy.
a=agent.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
t --set store.url=/s --set agent.gpu.enabled=true --set agent.image.pullPolicy=Never --set agent.runtimeClassName=sandboxed \
  --set "$a[0].matchExpressions[0].key=pool" --set "$a[0].matchExpressions[0].operator=Exists" \
  --set "$a[1].matchFields[0].key=metadata.name" --set "$a[1].matchFields[0].operator=In" \
  --set "$a[1].matchFields[0].values[0]=n1" >"$WORK/gpuaff.yaml"
out=$(t --set store.url=/s --set attestation.existingSecret= 2>&1) && fail "rendered attestation without a Secret"
[[ $out == *"attestation.existingSecret"* ]] || fail "no clear error without attestation.existingSecret: $out"
# A library without its digest: the schema refuses it, and so does the template where the
# schema is skipped (--skip-schema-validation).
refused "at '/backends/onnxruntime'" --set backends.onnxruntime=1.31.1
out=$(t --skip-schema-validation --set store.url=/s --set backends.onnxruntime=1.31.1 2>&1) &&
  fail "rendered an onnxruntime backend without its library digest"
grep -q "VERSION@sha256" <<<"$out" || fail "backends.onnxruntime refusal: $out"
ident="1.31.1@sha256:$(printf '%064d' 0)"
t --set store.url=/s --set backends.onnxruntime="$ident" | grep -cF "KILN_BACKEND_VERSIONS, value: \"tract=0.23.9,llamacpp=0.1.160,onnxruntime=$ident\"" >/dev/null ||
  fail "backends.onnxruntime does not reach the operator's KILN_BACKEND_VERSIONS"
# The GPU image's library: GPU classes' compile keys name it, with agent.gpu only; without
# agent.gpu the value changes nothing at all.
gident="1.31.1@sha256:$(printf '%064d' 1)"
refused "at '/backends/onnxruntimeGpu'" --set agent.gpu.enabled=true --set backends.onnxruntimeGpu=1.31.1
out=$(t --skip-schema-validation --set store.url=/s --set agent.gpu.enabled=true --set backends.onnxruntimeGpu=1.31.1 2>&1) &&
  fail "rendered a GPU onnxruntime backend without its library digest"
grep -q "onnxruntimeGpu must be VERSION@sha256" <<<"$out" || fail "backends.onnxruntimeGpu refusal: $out"
t --set store.url=/s --set agent.gpu.enabled=true --set backends.onnxruntime="$ident" --set backends.onnxruntimeGpu="$gident" |
  grep -cF "KILN_GPU_BACKEND_VERSIONS, value: \"tract=0.23.9,llamacpp=0.1.160,onnxruntime=$gident\"" >/dev/null ||
  fail "backends.onnxruntimeGpu does not reach the operator's KILN_GPU_BACKEND_VERSIONS"
cmp -s <(t --set store.url=/s --set backends.onnxruntime="$ident") \
  <(t --set store.url=/s --set backends.onnxruntime="$ident" --set backends.onnxruntimeGpu="$gident") ||
  fail "backends.onnxruntimeGpu changes the render without agent.gpu"
# The compile image (IREE's compiler): compile Jobs run it, with its own pull policy, and
# backends.iree enters KILN_BACKEND_VERSIONS; the agent DaemonSet keeps the agent image.
# backends.iree without the compile image, or not VERSION+FLAGS, is refused saying what to fix.
refused "backends.iree needs compile.image" --set backends.iree=3.13.0+llvm-cpu.1
refused "at '/backends/iree': '3.13' does not match" --set backends.iree=3.13
refused "at '/compile/image/pullPolicy'" --set compile.image.pullPolicy=always
t --set store.url=/s --set backends.onnxruntime="$ident" --set backends.iree=3.13.0+llvm-cpu.1 \
  --set compile.image.repository=reg.example/k/compiler --set compile.image.tag=v2 \
  --set compile.image.pullPolicy=Always --set agent.image.repository=reg.example/k/agent | python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
spec = lambda kind, name: [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name][0]["spec"]["template"]["spec"]["containers"][0]
env = {e["name"]: e.get("value") for e in spec("Deployment", "kiln-operator")["env"]}
want = [(env["KILN_AGENT_IMAGE"], "reg.example/k/compiler:v2"), (env["KILN_AGENT_IMAGE_PULL_POLICY"], "Always"),
        (env["KILN_BACKEND_VERSIONS"], "tract=0.23.9,llamacpp=0.1.160,onnxruntime=" + sys.argv[1] + ",iree=3.13.0+llvm-cpu.1"),
        (spec("DaemonSet", "kiln-agent")["image"], "reg.example/k/agent:0.1.0")]
bad = [f"{got} != {exp}" for got, exp in want if got != exp]
print(*bad, sep="\n", file=sys.stderr)
sys.exit(1 if bad else 0)' "$ident" || fail "compile.image and backends.iree do not reach the operator as they should"
# Images pinned by digest (the values scripts/push-images.sh writes): repository@digest in the
# operator, both agent DaemonSets, the CSI plugin's and the compile Jobs' images the operator is
# given; a malformed digest is refused with what to write.
d1="sha256:$(printf '%064d' 1)" d2="sha256:$(printf '%064d' 2)" d3="sha256:$(printf '%064d' 3)" d4="sha256:$(printf '%064d' 4)"
t --set store.url=/s --set agent.gpu.enabled=true --set backends.onnxruntimeGpu="$gident" \
  --set operator.image.repository=reg.example/k/operator --set operator.image.tag=v1 --set operator.image.digest="$d1" \
  --set agent.image.repository=reg.example/k/agent --set agent.image.digest="$d2" \
  --set agent.gpu.image.repository=reg.example/k/agent-gpu --set agent.gpu.image.digest="$d3" \
  --set csi.image.repository=reg.example/k/csi --set csi.image.digest="$d4" | python3 -c '
import sys, yaml
d1, d2, d3, d4 = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
image = lambda kind, name: [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name][0]["spec"]["template"]["spec"]["containers"][0]
op = image("Deployment", "kiln-operator")
env = {e["name"]: e.get("value") for e in op["env"]}
want = [(op["image"], "reg.example/k/operator@" + d1), (image("DaemonSet", "kiln-agent")["image"], "reg.example/k/agent@" + d2),
        (image("DaemonSet", "kiln-agent-gpu")["image"], "reg.example/k/agent-gpu@" + d3),
        (image("DaemonSet", "kiln-csi")["image"], "reg.example/k/csi@" + d4),
        (env["KILN_AGENT_IMAGE"], "reg.example/k/agent@" + d2), (env["KILN_GPU_AGENT_IMAGE"], "reg.example/k/agent-gpu@" + d3)]
bad = [f"{got} != {exp}" for got, exp in want if got != exp]
print(*bad, sep="\n", file=sys.stderr)
sys.exit(1 if bad else 0)' "$d1" "$d2" "$d3" "$d4" || fail "image digests do not pin the images"
refused "at '/agent/image/digest': 'sha256:abc' does not match pattern '^(sha256:[0-9a-f]{64})?\$'" --set agent.image.digest=sha256:abc
refused "at '/csi/image/digest'" --set csi.image.digest="sha256:$(printf '%064d' 0 | tr 0 A)"
out=$(t --skip-schema-validation --set store.url=/s --set agent.image.digest=sha256:abc 2>&1) && fail "rendered a malformed image digest"
grep -q 'expected sha256:<64 lowercase hex>' <<<"$out" || fail "malformed image digest refusal: $out"

# README.md's values table is what scripts/check/chart-readme.py writes; a changed comment, or a key
# values.schema.json lacks, is caught (on copies of the chart).
python3 "$REPO/scripts/check/chart-readme.py" --check "$CHART" ||
  fail "charts/kiln/README.md is not what scripts/check/chart-readme.py writes: run it and commit the result"
cp -r "$CHART" "$WORK/stale" && cp -r "$CHART" "$WORK/unschemed"
sed -i 's/^    # Name of that Lease\.$/    # Name of the Lease./' "$WORK/stale/values.yaml"
out=$(python3 "$REPO/scripts/check/chart-readme.py" --check "$WORK/stale" 2>&1) && fail "chart-readme.py --check passed a stale README"
grep -qF '+| `operator.leaderElection.leaseName` | `kiln-operator` | Name of the Lease. |' <<<"$out" ||
  fail "chart-readme.py --check does not show the stale row: $out"
printf '# A key the schema lacks.\nextra: 1\n' >>"$WORK/unschemed/values.yaml"
out=$(python3 "$REPO/scripts/check/chart-readme.py" --check "$WORK/unschemed" 2>&1) && fail "chart-readme.py --check passed a key the schema lacks"
grep -qF "extra is not in values.schema.json" <<<"$out" || fail "chart-readme.py does not name the key the schema lacks: $out"

python3 - "$REPO" "$WORK" <<'PY'
import glob, os, re, sys, yaml
repo, work = sys.argv[1], sys.argv[2]
errors = []
def check(ok, what):
    if not ok:
        errors.append(what)

def load(name):
    return [d for d in yaml.safe_load_all(open(f"{work}/{name}.yaml")) if d]
def get(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found
def one(docs, kind, name):
    found = get(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]
def env(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}

fs, oci, minimal, unsigned, srcsig, gpuaff = load("fs"), load("oci"), load("min"), load("unsigned"), load("srcsig"), load("gpuaff")
nocsi, kubeletdir = load("nocsi"), load("kubeletdir")

# CRDs: exactly what crdgen writes (into files/crds/, the one committed copy; kiln-crds' tests
# keep it current), with the keep policy by default and switchable.
files = {}
for f in glob.glob(f"{repo}/charts/kiln/files/crds/*.yaml"):
    d = yaml.safe_load(open(f)); files[d["metadata"]["name"]] = d
check(sorted(files) == ["compiledtargets.kiln.dev", "kilnnodes.kiln.dev", "modelartifacts.kiln.dev"], f"files/crds/: {sorted(files)}")
crds = get(fs, "CustomResourceDefinition")
check(sorted(c["metadata"]["name"] for c in crds) == sorted(files), "CRDs rendered")
for c in crds:
    check(c["spec"] == files[c["metadata"]["name"]]["spec"], f"{c['metadata']['name']} spec differs from crdgen's")
    check(c["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep", "CRDs kept by default")
for c in get(oci, "CustomResourceDefinition"):
    check("helm.sh/resource-policy" not in c["metadata"].get("annotations", {}), "crds.keep=false still keeps")
check(not get(minimal, "CustomResourceDefinition"), "crds.enabled=false still renders CRDs")

# Operator Deployment.
dep = one(fs, "Deployment", "kiln-operator")
spec = dep["spec"]["template"]["spec"]
c = spec["containers"][0]
e = env(c)
check(dep["spec"]["replicas"] == 1, "operator replicas default 1")
check(spec["serviceAccountName"] == "kiln-operator", "operator SA")
check(spec["securityContext"].get("runAsNonRoot") is True, "operator non-root")
check(c["securityContext"].get("readOnlyRootFilesystem") is True, "operator read-only root fs")
check(c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz", "operator probes")
check("limits" in c["resources"] and "requests" in c["resources"], "operator resources")
check(e.get("KILN_STORE") == "/var/lib/kiln/store", "operator KILN_STORE (fs)")
check(e.get("KILN_AGENT_IMAGE") == "kiln/agent:0.1.0", "operator KILN_AGENT_IMAGE")
check(not any(k.startswith("KILN_GPU_") for k in e), "no GPU compile worker without agent.gpu")
# agent.gpu: GPU classes' compile Jobs run the GPU image (keyed on its libraries: tract only
# without backends.onnxruntimeGpu) under the GPU agent's RuntimeClass, its own or inherited.
ge = env(one(oci, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0])
check(ge.get("KILN_GPU_AGENT_IMAGE") == "kiln/agent-gpu:0.1.0" and ge.get("KILN_AGENT_IMAGE") == "kiln/agent:0.1.0",
      f"compile Jobs' images with agent.gpu: {ge}")
check(ge.get("KILN_GPU_BACKEND_VERSIONS") == "tract=0.23.9,llamacpp=0.1.160" and ge.get("KILN_GPU_RUNTIME_CLASS") == "nvidia",
      f"GPU compile worker's versions and RuntimeClass: {ge}")
ae = env(one(gpuaff, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0])
check(ae.get("KILN_GPU_RUNTIME_CLASS") == "sandboxed", "GPU compile Jobs inherit agent.runtimeClassName")
check(e.get("KILN_LEASE_NAME") == "kiln-operator" and "KILN_NO_LEADER_ELECTION" not in e, "leader election on")
check(e.get("KILN_SOURCES_HOST_PATH") == "/srv/models", "sources host path")
check(e.get("POD_NAMESPACE") == {"fieldRef": {"fieldPath": "metadata.namespace"}}, "POD_NAMESPACE downward API")
check({"name": "store", "mountPath": "/var/lib/kiln/store", "readOnly": True} in c["volumeMounts"], "operator store mount read-only")
me = env(one(minimal, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0])
check(me.get("KILN_NO_LEADER_ELECTION") == "true" and me.get("KILN_STORE") == "/data/kiln", "no election; file:// store")
check(not get(minimal, "Role"), "no lease Role without leader election")

# Agent DaemonSet.
ds = one(fs, "DaemonSet", "kiln-agent")
spec = ds["spec"]["template"]["spec"]
c = spec["containers"][0]
e = env(c)
check(c["args"] == ["run"], "agent runs `kiln-agent run`")
check(spec["serviceAccountName"] == "kiln-agent", "agent SA")
check(e.get("NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, "NODE_NAME from the downward API")
check(e.get("KILN_CACHE") == "/var/lib/kiln/cache" and e.get("KILN_STORE") == "/var/lib/kiln/store", "agent cache/store env")
check(e.get("KILN_LISTEN") == "0.0.0.0:8080", "agent listen")
vols = {v["name"]: v for v in spec["volumes"]}
check(vols["cache"]["hostPath"]["path"] == "/var/lib/kiln/cache", "cache hostPath")
check(c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz", "agent probes")
check(c["securityContext"].get("readOnlyRootFilesystem") is True and c["securityContext"]["capabilities"]["drop"] == ["ALL"], "agent hardening")
check("runtimeClassName" not in spec and not any(k.startswith("NVIDIA") for k in e), "no GPU access by default")
check("nvidia.com/gpu" not in str(c.get("resources")), "agent claims no GPU")
check("affinity" not in spec and [d["metadata"]["name"] for d in get(fs, "DaemonSet")] == ["kiln-agent", "kiln-csi"], "one agent DaemonSet (and the CSI plugin's), no affinity, by default")
check(c["securityContext"].get("privileged") is not True and c["securityContext"].get("allowPrivilegeEscalation") is False, "the engine-running agent is not privileged")
check(c["image"] == "kiln/agent:0.1.0", "agent image")
# agent.gpu.enabled: kiln-agent-gpu with the GPU image and the devices on the nodes labelled
# nvidia.com/gpu.present=true, kiln-agent with the CPU image and no GPU access everywhere else.
gds = one(oci, "DaemonSet", "kiln-agent-gpu")
gspec = gds["spec"]["template"]["spec"]
ge = env(gspec["containers"][0])
check(gspec["containers"][0]["image"] == "kiln/agent-gpu:0.1.0", "GPU agent runs the GPU image")
check(gspec.get("runtimeClassName") == "nvidia" and ge.get("NVIDIA_VISIBLE_DEVICES") == "all" and
      ge.get("NVIDIA_DRIVER_CAPABILITIES") == "compute,utility", "GPU access when asked")
check("nvidia.com/gpu" not in str(gspec["containers"][0]["resources"]), "GPU access claims no GPU")
# The GPU agent reads its host pid (NVML's process names) from the node's procfs, read-only;
# it does not share the host's PID namespace. The CPU agent gets neither.
hp = [m for m in gspec["containers"][0]["volumeMounts"] if m["name"] == "host-proc"]
hv = [v for v in gspec["volumes"] if v["name"] == "host-proc"]
check(hp == [{"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}] and
      hv == [{"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}}] and
      not gspec.get("hostPID"), f"GPU agent: host procfs read-only, no hostPID: {hp} {hv}")
cds = one(oci, "DaemonSet", "kiln-agent")
cspec = cds["spec"]["template"]["spec"]
check(not any(v["name"] == "host-proc" for v in cspec["volumes"]), "CPU agent: no host procfs")
check(cspec["containers"][0]["image"] == "kiln/agent:0.1.0" and "runtimeClassName" not in cspec and
      not any(k.startswith("NVIDIA") for k in env(cspec["containers"][0])), "CPU agent keeps the CPU image, no GPU access")
def required(spec):
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
gpu_expr = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
cpu_expr = {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}
check(required(gspec) == [{"matchExpressions": [gpu_expr]}], f"GPU agent only on GPU nodes: {required(gspec)}")
check(required(cspec) == [{"matchExpressions": [cpu_expr]}], f"CPU agent only off GPU nodes: {required(cspec)}")
# Selectors: the CPU one unchanged (immutable on upgrade), the GPU one not matching CPU pods.
check(cds["spec"]["selector"] == ds["spec"]["selector"], "CPU agent selector unchanged by agent.gpu")
gsel, clabels = gds["spec"]["selector"]["matchLabels"], cds["spec"]["template"]["metadata"]["labels"]
check(gsel == gds["spec"]["template"]["metadata"]["labels"] and not gsel.items() <= clabels.items(),
      "GPU agent selector matches its own pods and not the CPU agent's")
check(gds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "agent", "GPU agents behind the agent metrics Service")
# A user's required terms keep their meaning, each ANDed with the GPU label; pull policy and
# RuntimeClass inherit.
g, cp = one(gpuaff, "DaemonSet", "kiln-agent-gpu")["spec"]["template"]["spec"], one(gpuaff, "DaemonSet", "kiln-agent")["spec"]["template"]["spec"]
check(required(g) == [{"matchExpressions": [{"key": "pool", "operator": "Exists"}, gpu_expr]},
                      {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "matchExpressions": [gpu_expr]}],
      f"GPU label ANDed into every user term: {required(g)}")
check(required(cp)[0]["matchExpressions"][-1] == cpu_expr and required(cp)[1]["matchExpressions"] == [cpu_expr], "CPU agent: NotIn ANDed into every user term")
check(g["containers"][0]["imagePullPolicy"] == "Never" and g.get("runtimeClassName") == "sandboxed" and cp.get("runtimeClassName") == "sandboxed",
      "GPU agent inherits agent.image.pullPolicy and agent.runtimeClassName when its own are empty")
check(not get(minimal, "DaemonSet"), "agent.enabled=false (the CSI plugin, which mounts what the agent verified, goes too)")

# The CSI node plugin: its own DaemonSet, image and account (get KilnNodes, nothing else),
# privileged for its mounts, the kubelet's directories at their own paths (pods Bidirectional),
# the agent's cache; the CSIDriver for inline volumes. csi.enabled=false renders none of it.
csi = one(fs, "DaemonSet", "kiln-csi")["spec"]["template"]["spec"]
cc, ce = csi["containers"][0], env(csi["containers"][0])
check(cc["command"] == ["/bin/kiln-csi"] and "args" not in cc and csi["serviceAccountName"] == "kiln-csi",
      f"kiln-csi runs /bin/kiln-csi as kiln-csi: {cc['command']} {cc.get('args')}")
check(cc["image"] == "kiln/csi:0.1.0" and cc["imagePullPolicy"] == "IfNotPresent", f"kiln-csi image: {cc['image']} {cc['imagePullPolicy']}")
check(one(gpuaff, "DaemonSet", "kiln-csi")["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent",
      "the CSI plugin's pull policy is csi.image's, not agent.image's")
check(cc["securityContext"].get("privileged") is True, "the CSI plugin is privileged (mounts)")
mounts = {m["name"]: m for m in cc["volumeMounts"]}
cvols = {v["name"]: v["hostPath"]["path"] for v in csi["volumes"]}
check(mounts["pods"]["mountPath"] == cvols["pods"] == "/var/lib/kubelet/pods" and mounts["pods"].get("mountPropagation") == "Bidirectional", f"pods mount: {mounts['pods']}")
check(mounts["registration"]["mountPath"] == cvols["registration"] == "/var/lib/kubelet/plugins_registry", "registration dir at its own path")
check(cvols["socket"] == "/var/lib/kubelet/plugins/csi.kiln.dev" and mounts["socket"]["mountPath"] == "/csi", "socket dir")
check(cvols["cache"] == vols["cache"]["hostPath"]["path"] and mounts["cache"]["mountPath"] == ce["KILN_CACHE"], "the plugin reads the agent's cache")
check(ce.get("KILN_CSI_KUBELET_ENDPOINT") == "/var/lib/kubelet/plugins/csi.kiln.dev/csi.sock" and ce.get("KILN_KUBELET_DIR") == "/var/lib/kubelet", f"kubelet paths: {ce}")
check(ce.get("KILN_NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, "KILN_NODE_NAME from the downward API")
kd = one(kubeletdir, "DaemonSet", "kiln-csi")["spec"]["template"]["spec"]
check({v["name"]: v["hostPath"]["path"] for v in kd["volumes"]}["pods"] == "/data/kubelet/pods" and env(kd["containers"][0])["KILN_KUBELET_DIR"] == "/data/kubelet", "csi.kubeletDir")
check(one(fs, "ClusterRole", "kiln-csi")["rules"] == [{"apiGroups": ["kiln.dev"], "resources": ["kilnnodes"], "verbs": ["get"]}], "kiln-csi may only get KilnNodes")
check(one(fs, "CSIDriver", "csi.kiln.dev")["spec"] == {"attachRequired": False, "podInfoOnMount": True, "volumeLifecycleModes": ["Ephemeral"], "fsGroupPolicy": "None"}, "CSIDriver spec")
check(not get(nocsi, "CSIDriver") and [d["metadata"]["name"] for d in get(nocsi, "DaemonSet")] == ["kiln-agent"] and not [s for s in get(nocsi, "ServiceAccount") if s["metadata"]["name"] == "kiln-csi"], "csi.enabled=false")

# Registry settings.
for obj in (one(oci, "Deployment", "kiln-operator"), one(oci, "DaemonSet", "kiln-agent"), one(oci, "DaemonSet", "kiln-agent-gpu")):
    ps = obj["spec"]["template"]["spec"]
    oe = env(ps["containers"][0])
    check(oe.get("KILN_STORE") == "oci://10.0.0.1:5000/kiln" and oe.get("KILN_REGISTRY_INSECURE") == "true", "oci store env")
    check(oe.get("KILN_REGISTRY_USERNAME") == {"secretKeyRef": {"name": "regcred", "key": "username", "optional": True}}, "username from Secret")
    check(oe.get("KILN_REGISTRY_PASSWORD") == {"secretKeyRef": {"name": "regcred", "key": "password", "optional": True}}, "password from Secret")
    check(not any(v["name"] == "store" for v in ps.get("volumes", [])), "no store hostPath with a registry")
check(env(one(oci, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0]).get("KILN_REGISTRY_SECRET") == "regcred", "compile Jobs told the Secret")

# Attestation: on by default; operator and agents get only the public key of the Secret, the
# compile Jobs (through the operator) the Secret's name and the kiln-compile account.
for obj in (one(fs, "Deployment", "kiln-operator"), one(fs, "DaemonSet", "kiln-agent")):
    ps = obj["spec"]["template"]["spec"]
    te = env(ps["containers"][0])
    check(te.get("KILN_TRUST_KEY") == "/var/run/kiln/trust/signing.pub", f"{obj['kind']} trusts the chart's key")
    trust = [v for v in ps["volumes"] if v["name"] == "trust"]
    check(len(trust) == 1 and trust[0]["secret"] == {"secretName": "kiln-signing", "items": [{"key": "signing.pub", "path": "signing.pub"}]}, f"{obj['kind']} mounts only signing.pub: {trust}")
    check({"name": "trust", "mountPath": "/var/run/kiln/trust", "readOnly": True} in ps["containers"][0]["volumeMounts"], f"{obj['kind']} trust mount")
oe = env(one(fs, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0])
check(oe.get("KILN_COMPILE_MAX_MEMORY") == "64Gi" and oe.get("KILN_COMPILE_TOLERATION_KEYS") == "nvidia.com/gpu", "compile bounds passed to the operator")
check(oe.get("KILN_SIGNING_SECRET") == "kiln-signing" and oe.get("KILN_COMPILE_SERVICE_ACCOUNT") == "kiln-compile", "compile Jobs told the signing Secret and account")
# Source signatures: off by default; the Secret's name and the policy go to the operator (which
# mounts the key into the compile Jobs' publisher), nothing to anything else.
check(not any(k.startswith("KILN_SOURCE_TRUST") or k == "KILN_REQUIRE_SOURCE_SIGNATURE" for k in oe), "source signatures off by default")
se = env(one(srcsig, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0])
check(se.get("KILN_SOURCE_TRUST_SECRET") == "kiln-source-keys" and se.get("KILN_REQUIRE_SOURCE_SIGNATURE") == "true", f"source signature settings: {se}")
check(not any(k.startswith("KILN_SOURCE") for k in env(one(srcsig, "DaemonSet", "kiln-agent")["spec"]["template"]["spec"]["containers"][0])), "agents get no source keys")
check("KILN_TRUST_KEY" not in env(one(unsigned, "Deployment", "kiln-operator")["spec"]["template"]["spec"]["containers"][0]), "attestation.enabled=false")

# The agent's node confinement, for the release namespace's agent account, failing closed, on
# writes to KilnNodes and pods' status, each checked against the node in the token; off with
# agent.nodeConfinement=false (its refusals on a real apiserver: e2e/tests/kiln.sh).
vap = one(fs, "ValidatingAdmissionPolicy", "kiln-agent-node-confinement")["spec"]
check(vap["failurePolicy"] == "Fail", "agent policy fails closed")
check(sorted(r for rule in vap["matchConstraints"]["resourceRules"] for r in rule["resources"]) == ["kilnnodes", "kilnnodes/status", "pods/status"],
      f"agent policy resources: {vap['matchConstraints']['resourceRules']}")
check(len(vap["validations"]) == 3 and all("variables.node" in v["expression"] for v in vap["validations"]), f"agent policy validations: {vap['validations']}")
check(vap["matchConditions"][0]["expression"] == "request.userInfo.username == 'system:serviceaccount:kiln-system:kiln-agent'", "policy matches the release's agent account")
check(one(fs, "ValidatingAdmissionPolicyBinding", "kiln-agent-node-confinement")["spec"] == {"policyName": "kiln-agent-node-confinement", "validationActions": ["Deny"]}, "policy binding denies")
check(not get(minimal, "ValidatingAdmissionPolicy"), "no agent, no agent policy")

# ServiceAccounts and least-privilege RBAC.
check(sorted(s["metadata"]["name"] for s in get(fs, "ServiceAccount")) == ["kiln-agent", "kiln-compile", "kiln-csi", "kiln-operator"], "four ServiceAccounts")
check(one(fs, "ServiceAccount", "kiln-compile").get("automountServiceAccountToken") is False, "compile SA mounts no token")
subjects = [s["name"] for b in get(fs, "ClusterRoleBinding") + get(fs, "RoleBinding") for s in b["subjects"]]
check("kiln-compile" not in subjects, "compile SA has no RBAC")
for role in get(fs, "ClusterRole") + get(fs, "Role"):
    for rule in role["rules"]:
        check("secrets" not in rule["resources"] and "*" not in rule["resources"] and "*" not in rule["verbs"], f"{role['metadata']['name']}: {rule}")
# The rules themselves are proven by the operator and agent tests, which run the binaries with
# tokens of these accounts (e2e/tests/operator-lib.sh, agent.sh render them with helm template).
check([r["resources"] for r in one(fs, "Role", "kiln-operator-leader")["rules"]] == [["leases"]], "the operator's Role is for its Lease only")
# agent.servingSecrets: the agent may get exactly the Secrets listed, by name, in their
# namespaces, and nothing else of secrets anywhere.
sec = load("secrets")
roles = {r["metadata"]["namespace"]: r for r in get(sec, "Role", "kiln-agent-serving-secrets")}
check(sorted(roles) == ["ml", "web"], f"one Role per namespace with serving secrets: {sorted(roles)}")
check(roles.get("ml", {}).get("rules") == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["vllm-key", "tgi-key"], "verbs": ["get"]}],
      f"the ml Role gets the two Secrets by name only: {roles.get('ml')}")
check(roles.get("web", {}).get("rules", [{}])[0].get("resourceNames") == ["vllm-key"], "the web Role names its Secret only")
bindings = {b["metadata"]["namespace"]: b for b in get(sec, "RoleBinding", "kiln-agent-serving-secrets")}
check(sorted(bindings) == ["ml", "web"] and all(b["subjects"] == [{"kind": "ServiceAccount", "name": "kiln-agent", "namespace": "kiln-system"}] for b in bindings.values()),
      f"the Roles bound to kiln-agent only: {bindings}")
check(all("secrets" not in r["resources"] for c in get(sec, "ClusterRole") for r in c["rules"]), "no cluster-wide secrets rule")
check(not get(fs, "Role", "kiln-agent-serving-secrets"), "no serving-secrets Role by default")
agent_rules = one(fs, "ClusterRole", "kiln-agent")["rules"]
check(not any(v in r["verbs"] for r in agent_rules for v in ("delete", "deletecollection", "update")), "agent deletes or updates nothing")
check(not any(r["resources"] == ["pods"] and set(r["verbs"]) - {"get", "list", "watch"} for r in agent_rules), "agent writes pods only via pods/status")

# Every variable the chart sets is one the binary reads (a typo would be silently ignored); the
# registry flags both take are declared once, in kiln-store. The agent's global flags are in its
# main.rs, the flags of `run` (what the DaemonSet runs) in cmd/run.rs; kiln-csi's anywhere in its
# crate, csi-plugin/src.
agent_srcs = ["node-agent/src/main.rs", "node-agent/src/cmd/run.rs"]
csi_srcs = sorted(os.path.relpath(p, repo) for p in glob.glob(f"{repo}/csi-plugin/src/**/*.rs", recursive=True))
check(bool(csi_srcs), "no csi-plugin/src/**/*.rs: where is kiln-csi's source?")
for srcs, kind, name in ((["operator/src/main.rs"], "Deployment", "kiln-operator"), (agent_srcs, "DaemonSet", "kiln-agent"), (agent_srcs, "DaemonSet", "kiln-agent-gpu"), (csi_srcs, "DaemonSet", "kiln-csi")):
    declared = set(re.findall(r'env\s*=\s*"(\w+)"', "".join(open(f"{repo}/{src}").read() for src in srcs + ["store/src/lib.rs"])))
    for docs in (fs, oci) if name != "kiln-agent-gpu" else (oci, gpuaff):
        for var in env(one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]):
            check(var in declared or var.startswith("NVIDIA_"), f"{name} gets {var}, which {' and '.join(srcs)} do not read")

# Monitoring objects only when asked.
check(not get(fs, "ServiceMonitor") and not get(fs, "PrometheusRule"), "no monitoring CRs by default")
check(len(get(oci, "ServiceMonitor")) == 2, "two ServiceMonitors")
check(sorted(s["metadata"]["name"] for s in get(fs, "Service")) == ["kiln-agent-metrics", "kiln-operator-metrics"], "metrics Services")
check(not get(minimal, "Service"), "metrics.service.enabled=false")
rule = one(oci, "PrometheusRule", "kiln")
yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(f"{work}/rules.yaml", "w"))
# Alerts name only metrics the components register (a rename breaks this, not the alert).
registered = set()
for src, prefix in (("operator/src/metrics.rs", "kiln_operator_"), ("engines/src/metrics.rs", "kiln_agent_")):
    registered |= {prefix + n for n in re.findall(r'register\(\s*"(\w+)"', open(f"{repo}/{src}").read())}
alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
check({"KilnNodeFailClosed", "KilnTargetStalled", "KilnParityFailures"} <= set(alerts), f"alerts: {alerts}")
for g in rule["spec"]["groups"]:
    for r in g["rules"]:
        for m in re.findall(r"kiln_(?:operator|agent)_\w+", r["expr"]):
            check(re.sub(r"_(total|bucket|sum|count)$", "", m) in registered, f"{r['alert']}: {m} is not a registered metric")

# The Grafana dashboard: only when asked, labelled for the sidecar, the shipped JSON unchanged
# (its queries are checked against the real expositions by the components' exposition tests).
import json
check(not [c for c in get(fs, "ConfigMap") if c["metadata"]["name"] == "kiln-dashboard"], "no dashboard by default")
board = one(oci, "ConfigMap", "kiln-dashboard")
check(board["metadata"]["labels"].get("grafana_dashboard") == "1", "dashboard sidecar label")
check(json.loads(board["data"]["kiln.json"]) == json.load(open(f"{repo}/charts/kiln/files/dashboards/kiln.json")),
      "the dashboard ConfigMap holds files/dashboards/kiln.json")

# README.md's values table (scripts/check/chart-readme.py reads values.yaml with a parser of its own):
# each default it shows is the value values.yaml holds, and each top-level key has its row.
values = yaml.safe_load(open(f"{repo}/charts/kiln/values.yaml"))
table = {}
for line in open(f"{repo}/charts/kiln/README.md"):
    if m := re.match(r"^\| `([\w.]+)` \| (.*?) \| ", line):
        table[m.group(1)] = m.group(2)
def at(path):
    v = values
    for k in path.split("."):
        v = v[k]
    return v
check(set(values) <= set(table), f"README.md lacks rows for {sorted(set(values) - set(table))}")
shown = {k: v[1:-1].replace("\\|", "|") for k, v in table.items() if v}  # a section's row has no default
check(bool(shown), "README.md shows no defaults")
for key, text in shown.items():
    check(yaml.safe_load(text) == at(key), f"README.md: {key} shows {text}, values.yaml holds {at(key)!r}")

# Every values.yaml key carries a prose comment, except inside free-form Kubernetes objects.
free = {"resources", "podSecurityContext", "securityContext", "updateStrategy", "nodeSelector", "tolerations",
        "affinity", "podAnnotations", "labels", "annotations", "extraEnv", "imagePullSecrets"}
stack, prev = [], ""
for line in open(f"{repo}/charts/kiln/values.yaml"):
    m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
    if m and not line.lstrip().startswith("-"):
        indent, key = len(m.group(1)), m.group(2)
        stack = [(i, k) for i, k in stack if i < indent]
        if not any(k in free for _, k in stack):
            check(prev.lstrip().startswith("#"), f"values.yaml: {key} has no comment")
        stack.append((indent, key))
    if line.strip():
        prev = line
if errors:
    print("\n".join("chart: " + e for e in errors)); sys.exit(1)
print(f"chart renders as promised: {len(fs)} objects; alerts {', '.join(alerts)}")
PY
promtool check rules "$WORK/rules.yaml"
echo "chart-render passed"
