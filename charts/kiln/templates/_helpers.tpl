{{/* Chart name, overridable. */}}
{{- define "kiln.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of cluster-scoped names: the release name, with the chart name unless it has it. */}}
{{- define "kiln.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kiln.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object; pass (dict "root" $ "component" "operator"). */}}
{{- define "kiln.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kiln.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component; pass (dict "root" $ "component" "agent"). */}}
{{- define "kiln.selector" -}}
app.kubernetes.io/name: {{ include "kiln.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference; pass (dict "root" $ "image" .Values.operator.image): repository@digest
when the image has a digest (the tag is then only a label, as the kubelet pulls by digest), else
repository:tag. */}}
{{- define "kiln.image" -}}
{{- with .image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "image digest %q: expected sha256:<64 lowercase hex>, as scripts/push-images.sh prints it" .) }}
{{- end }}
{{- printf "%s@%s" $.image.repository . }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* The store URL, required. */}}
{{- define "kiln.storeUrl" -}}
{{- required "store.url is required: oci://HOST[:PORT]/REPOSITORY for a registry, or an absolute path for a single-node filesystem store" .Values.store.url }}
{{- end }}

{{/* The filesystem store's host path, or empty for a registry. */}}
{{- define "kiln.storePath" -}}
{{- $url := include "kiln.storeUrl" . }}
{{- if hasPrefix "oci://" $url }}
{{- else if hasPrefix "file://" $url }}
{{- trimPrefix "file://" $url }}
{{- else if hasPrefix "/" $url }}
{{- $url }}
{{- else }}
{{- fail (printf "store.url %q: expected oci://HOST[:PORT]/REPOSITORY, file:///PATH or an absolute path" $url) }}
{{- end }}
{{- end }}

{{/* Store settings as container environment (KILN_STORE and the registry options). */}}
{{- define "kiln.storeEnv" -}}
{{- $path := include "kiln.storePath" . }}
- name: KILN_STORE
  value: {{ default (include "kiln.storeUrl" .) $path | quote }}
{{- if not $path }}
- name: KILN_REGISTRY_INSECURE
  value: {{ .Values.store.insecure | toString | quote }}
{{- with .Values.store.mirrors }}
- name: KILN_REGISTRY_MIRRORS
  value: {{ toJson . | quote }}
{{- end }}
{{- with .Values.store.existingSecret }}
- name: KILN_REGISTRY_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: username, optional: true}
- name: KILN_REGISTRY_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: password, optional: true}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret with the attestation key pair (signing.key for compile Jobs, signing.pub). */}}
{{- define "kiln.signingSecret" -}}
{{- required "attestation.existingSecret: name the Secret with signing.key and signing.pub (kiln-agent keygen DIR && kubectl create secret generic kiln-signing --from-file=DIR), or set attestation.enabled=false" .Values.attestation.existingSecret }}
{{- end }}

{{/* A volume with only the public key of that Secret: the operator and agents never get the private key. */}}
{{- define "kiln.trustVolume" -}}
- name: trust
  secret:
    secretName: {{ include "kiln.signingSecret" . }}
    items:
      - {key: signing.pub, path: signing.pub}
{{- end }}

{{/* Selector labels of an agent DaemonSet; pass (dict "root" $ "gpu" BOOL). The GPU one adds
kiln.dev/agent-image: gpu, so that its selector does not match the CPU agent's pods. */}}
{{- define "kiln.agentSelector" -}}
{{- include "kiln.selector" (dict "root" .root "component" "agent") }}
{{- if .gpu }}
kiln.dev/agent-image: gpu
{{- end }}
{{- end }}

{{/* Affinity of an agent DaemonSet; pass (dict "root" $ "gpu" BOOL). agent.affinity, and with
agent.gpu.enabled the GPU node label required "true" (GPU agent) or not "true" (CPU agent),
added to every one of agent.affinity's required node selector terms (terms are ORed, the
expressions within one ANDed). */}}
{{- define "kiln.agentAffinity" -}}
{{- $aff := deepCopy (default (dict) .root.Values.agent.affinity) }}
{{- if .root.Values.agent.gpu.enabled }}
{{- $expr := dict "key" .root.Values.agent.gpu.nodeLabel "operator" (ternary "In" "NotIn" .gpu) "values" (list "true") }}
{{- $na := default (dict) (get $aff "nodeAffinity") }}
{{- $req := default (dict) (get $na "requiredDuringSchedulingIgnoredDuringExecution") }}
{{- $terms := list }}
{{- range (default (list (dict)) (get $req "nodeSelectorTerms")) }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (append (default (list) (get $term "matchExpressions")) $expr) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- $_ := set $req "nodeSelectorTerms" $terms }}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
{{- $_ := set $aff "nodeAffinity" $na }}
{{- end }}
{{- with $aff }}{{ toYaml . }}{{ end }}
{{- end }}
