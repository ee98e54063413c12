#!/usr/bin/env bash
# Builds kiln's images from this work tree and pushes them to an OCI registry, printing each
# pushed image by digest; optionally writes the Helm values that pin them by digest.
#
#   scripts/push-images.sh [options] REGISTRY[/PREFIX]
#     e.g. scripts/push-images.sh --values kiln-images.yaml registry.example.com/kiln
#
#   --images LIST         operator,agent,csi,agent-gpu (the default; csi is the privileged
#                         CSI node plugin); the GPU agent image is 1.1 GB, leave it out where
#                         no node has an NVIDIA GPU; add compiler (the compile Jobs' image with
#                         IREE's compiler, 210 MB compressed) for backend.kind iree
#   --tag TAG             the tag pushed beside the digest (default: `git describe --always
#                         --dirty` of this work tree); the chart values pin the digest
#   --values FILE         write the chart values (image repositories, tags and digests, and the
#                         `backends` identities the images carry) to FILE; `-`: stdout
#   --plain-http          the registry speaks HTTP, or HTTPS with a certificate nothing here
#                         trusts (a test registry on a trusted network only)
#   --authfile FILE       registry credentials as `skopeo login`, `podman login` or `docker
#                         login` write them (default: skopeo's own lookup, $REGISTRY_AUTH_FILE,
#                         then ${XDG_RUNTIME_DIR}/containers/auth.json, then ~/.docker/config.json)
#   --operator-bin FILE   use this kiln-operator instead of building it (cargo build --release)
#   --agent-bin FILE      use this kiln-agent instead of building it
#   --csi-bin FILE        use this kiln-csi instead of building it
#   --cuda-agent DIR      the GPU agent image runs this CUDA build of kiln-agent (what
#                         scripts/build-agent-cuda.sh prints): GGUF models on the GPU; without
#                         it the GPU image's llama.cpp runs on the CPU only
#
# Credentials can also come from the environment: KILN_REGISTRY_USERNAME and
# KILN_REGISTRY_PASSWORD (the names kiln's components read) go into a private auth file for the
# push, never onto a command line. The images are pushed as REGISTRY/PREFIX/NAME:TAG with skopeo
# (Debian package skopeo, installed here when missing and running as root) from the OCI archives
# scripts/build-images.sh writes, so the digest pushed is the digest built. Stdout: one line per
# image, `NAME REGISTRY/PREFIX/NAME@sha256:...`; progress and timings on stderr.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
TOOL=push-images

usage() { sed -n '2,32s/^# \{0,1\}//p' "$0" >&2; exit 2; }
images=operator,agent,csi,agent-gpu tag= values= plain=0 authfile= operator_bin= agent_bin= csi_bin=
target=
cuda_agent=()
while (($#)); do
  case $1 in
    --images) images=${2:?--images needs a list}; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift ;;
    --values) values=${2:?--values needs a file}; shift ;;
    --plain-http) plain=1 ;;
    --authfile) authfile=${2:?--authfile needs a file}; shift ;;
    --operator-bin) operator_bin=${2:?--operator-bin needs a file}; shift ;;
    --agent-bin) agent_bin=${2:?--agent-bin needs a file}; shift ;;
    --csi-bin) csi_bin=${2:?--csi-bin needs a file}; shift ;;
    --cuda-agent) cuda_agent=(--cuda-agent "${2:?--cuda-agent needs a directory}"); shift ;;
    -h | --help) usage ;;
    -*) echo "push-images: unknown option $1" >&2; usage ;;
    *) [[ -z $target ]] || die "one REGISTRY[/PREFIX] only, got '$target' and '$1'"; target=$1 ;;
  esac
  shift
done
[[ -n $target ]] || usage
target=${target%/}
# A registry host (with a dot, a port or localhost) and lowercase path components, as the
# distribution spec names repositories; no scheme, tag or digest.
name_re='^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$' host_re='[.:]|^localhost$'
[[ $target =~ $name_re && ${target%%/*} =~ $host_re ]] ||
  die "'$target' is not REGISTRY[/PREFIX]: a registry host (registry.example.com, host:5000 or localhost) and lowercase path components, without https:// or a tag"
IFS=, read -ra wanted <<<"$images"
((${#wanted[@]})) || die "--images is empty: name operator, agent, csi, agent-gpu and/or compiler, comma-separated"
for name in "${wanted[@]}"; do
  [[ $name =~ ^(operator|agent|csi|agent-gpu|compiler)$ ]] || die "--images '$images': name operator, agent, csi, agent-gpu and/or compiler, comma-separated"
done
[[ -z $tag ]] && tag=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo latest)
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "tag '$tag' is not a valid OCI tag ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})"
[[ -z $authfile || -r $authfile ]] || die "--authfile $authfile cannot be read"
if [[ -n ${KILN_REGISTRY_USERNAME:-}${KILN_REGISTRY_PASSWORD:-} ]]; then
  [[ -n ${KILN_REGISTRY_USERNAME:-} && -n ${KILN_REGISTRY_PASSWORD:-} ]] ||
    die "KILN_REGISTRY_USERNAME and KILN_REGISTRY_PASSWORD must be set together"
  [[ -z $authfile ]] || die "give credentials by --authfile or by KILN_REGISTRY_USERNAME/KILN_REGISTRY_PASSWORD, not both"
fi

# skopeo: from the one list of prerequisites (group push), installed there when missing as root.
if command -v dpkg-query >/dev/null; then
  "$REPO/scripts/ensure-packages.sh" push || die "cannot install skopeo (scripts/ensure-packages.sh push)"
fi
command -v skopeo >/dev/null ||
  die "skopeo is missing; install it (Debian/Ubuntu: apt-get install skopeo; Fedora: dnf install skopeo) or run as root"

work=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-push-images.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 700 "$work"
if [[ -n ${KILN_REGISTRY_USERNAME:-} ]]; then
  # printf is a shell builtin: the password reaches the file without appearing in any argv.
  authfile=$work/auth.json
  (umask 077 && printf '{"auths":{"%s":{"auth":"%s"}}}\n' "${target%%/*}" \
    "$(printf '%s:%s' "$KILN_REGISTRY_USERNAME" "$KILN_REGISTRY_PASSWORD" | base64 -w0)" >"$authfile")
fi

# Build (release) only the binaries the images asked for need and no --*-bin gave.
need=()
for name in "${wanted[@]}"; do
  case $name in
    operator) [[ -n $operator_bin ]] || need+=(kiln-operator) ;;
    agent | agent-gpu | compiler) [[ -n $agent_bin ]] || need+=(kiln-agent) ;;
    csi) [[ -n $csi_bin ]] || need+=(kiln-csi) ;;
  esac
done
if ((${#need[@]})); then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  echo "push-images: cargo build --release ${need[*]/#/-p }" >&2
  (cd "$REPO" && cargo build --release --locked "${need[@]/#/--package=}" >&2)
fi
# since T: seconds since the date +%s.%N value T.
since() { awk -v t="$1" -v n="$(date +%s.%N)" 'BEGIN {printf "%.2f", n - t}'; }
t0=$(date +%s.%N)
built=$("$REPO/scripts/build-images.sh" --images "$images" --name-prefix "$target" --tag "$tag" \
  --operator-bin "${operator_bin:-$REPO/target/release/kiln-operator}" \
  --agent-bin "${agent_bin:-$REPO/target/release/kiln-agent}" \
  --csi-bin "${csi_bin:-$REPO/target/release/kiln-csi}" "${cuda_agent[@]}" "$work")
echo "push-images: built in $(since "$t0")s" >&2

skopeo_args=(--quiet --dest-tls-verify="$( ((plain)) && echo false || echo true)")
[[ -z $authfile ]] || skopeo_args+=(--dest-authfile "$authfile")
declare -A digest backends
order=()
while IFS=$'\t' read -r name tar backend; do
  t1=$(date +%s.%N)
  skopeo copy "${skopeo_args[@]}" --digestfile "$work/$name.digest" \
    "oci-archive:$tar" "docker://$target/$name:$tag" >&2 ||
    die "pushing $target/$name:$tag failed (credentials: --authfile or KILN_REGISTRY_USERNAME/KILN_REGISTRY_PASSWORD; a registry without TLS: --plain-http)"
  digest[$name]=$(cat "$work/$name.digest")
  [[ ${digest[$name]} =~ ^sha256:[0-9a-f]{64}$ ]] || die "skopeo reported digest '${digest[$name]}' for $name"
  backends[$name]=$backend
  order+=("$name")
  echo "push-images: pushed $name ($(stat -c %s "$tar") bytes) in $(since "$t1")s" >&2
  echo "$name $target/$name@${digest[$name]}"
done <<<"$built"
echo "push-images: ${#order[@]} image(s) built and pushed in $(since "$t0")s" >&2

[[ -n $values ]] || exit 0
# image_values NAME INDENT: the chart's image block for NAME.
image_values() {
  printf '%*simage:\n%*s  repository: %s\n%*s  tag: "%s"\n%*s  digest: %s\n' \
    "$2" '' "$2" '' "$target/$1" "$2" '' "$tag" "$2" '' "${digest[$1]}"
}
{
  echo "# Written by scripts/push-images.sh: kiln's images built from $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo 'this work tree'),"
  echo "# pinned by digest. helm install ... -f THIS_FILE"
  if [[ -n ${digest[operator]:-} ]]; then echo "operator:"; image_values operator 2; fi
  if [[ -n ${digest[agent]:-}${digest[agent-gpu]:-} ]]; then
    echo "agent:"
    [[ -z ${digest[agent]:-} ]] || image_values agent 2
    if [[ -n ${digest[agent-gpu]:-} ]]; then
      echo "  gpu:"
      echo "    # The GPU agent runs only with agent.gpu.enabled=true (nodes with the NVIDIA runtime)."
      image_values agent-gpu 4
    fi
  fi
  if [[ -n ${digest[csi]:-} ]]; then echo "csi:"; image_values csi 2; fi
  if [[ -n ${digest[compiler]:-} ]]; then
    echo "compile:"
    echo "  # Compile Jobs run the compiler image (the agent image with IREE's compiler)."
    image_values compiler 2
  fi
  # Each image's NAME=VALUE list, once per name: the compiler image's ONNX Runtime is the agent
  # image's library.
  declare -A carried=()
  for name in agent agent-gpu compiler; do
    IFS=, read -ra pairs <<<"${backends[$name]:--}"
    for pair in "${pairs[@]}"; do [[ $pair == - ]] || carried[${pair%%=*}]=${pair#*=}; done
  done
  if ((${#carried[@]})); then
    echo "# The runtimes these images carry, as the operator keys compiles on them."
    echo "backends:"
    for key in onnxruntime onnxruntimeGpu iree; do
      [[ -z ${carried[$key]:-} ]] || echo "  $key: \"${carried[$key]}\""
    done
  fi
} >"$([[ $values == - ]] && echo /dev/stdout || echo "$values")"
[[ $values == - ]] || echo "push-images: wrote $values" >&2
