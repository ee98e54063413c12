#!/usr/bin/env bash
# scripts/push-images.sh against a real registry that wants credentials (Debian's docker-registry
# with an htpasswd file, on a free local port; plain HTTP): refused without credentials and with a
# wrong password, each saying what to set; pushed with KILN_REGISTRY_USERNAME/PASSWORD and with
# --authfile; the printed digest is the digest the registry serves under the tag and the digest
# e2e/build-image wrote; --values pins exactly that; the password appears in no output and no
# auth file is left behind; malformed arguments are refused before anything is built. Pushes the
# operator image only (the binary under test: newer of target/{release,debug}, or
# KILN_OPERATOR_BIN), so it takes seconds. Exits 77 (skip), saying why, without docker-registry,
# htpasswd or skopeo when it cannot install them (scripts/ensure-packages.sh does as root).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
PUSH=$REPO/scripts/push-images.sh
fail() { echo "FAIL: test-push-images: $*" >&2; exit 1; }
skip() { echo "SKIP: test-push-images: $*" >&2; exit 77; }
command -v docker-registry >/dev/null || skip "docker-registry missing (scripts/ensure-packages.sh installs it as root)"
command -v htpasswd >/dev/null || skip "htpasswd missing (apache2-utils)"
if ! dpkg -s skopeo >/dev/null 2>&1 && [[ $EUID -ne 0 ]]; then skip "skopeo missing and not root to install it"; fi
bin=${KILN_OPERATOR_BIN:-}
if [[ -z $bin ]]; then
  for b in "$REPO/target/release/kiln-operator" "$REPO/target/debug/kiln-operator"; do
    [[ -x $b && ( -z $bin || $b -nt $bin ) ]] && bin=$b
  done
fi
[[ -n $bin ]] || fail "kiln-operator not built (cargo build -p kiln-operator)"

work=$(mktemp -d)
pid=
cleanup() { [[ -z $pid ]] || kill "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
password=pw-$RANDOM$RANDOM-not-in-any-output
htpasswd -Bbn kiln "$password" >"$work/htpasswd" 2>/dev/null
port=$(free_port)
cat >"$work/registry.yml" <<YAML
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/data}}
http: {addr: 127.0.0.1:$port, secret: test}
auth: {htpasswd: {realm: test, path: $work/htpasswd}}
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
pid=$!
for ((i = 0; i < 50; i++)); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/" || true) == 401 ]] && break
  sleep 0.1
done
target=localhost:$port/team/kiln
args=(--plain-http --images operator --tag t1 --operator-bin "$bin" --agent-bin "$bin")
# run NAME [ENV...] -- ARGS: push-images with ARGS, stdout and stderr to $work/NAME.{out,err}.
run() {
  local name=$1 envs=()
  shift
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  env -u KILN_REGISTRY_USERNAME -u KILN_REGISTRY_PASSWORD "${envs[@]}" TMPDIR="$work" \
    "$PUSH" "$@" >"$work/$name.out" 2>"$work/$name.err"
}
leaks() { ! grep -rlF "$password" "$work"/*.out "$work"/*.err; }

echo "== refused: no credentials, a wrong password"
run anon -- "${args[@]}" "$target" && fail "pushed without credentials"
grep -q 'KILN_REGISTRY_USERNAME/KILN_REGISTRY_PASSWORD' "$work/anon.err" || fail "no hint without credentials: $(tail -2 "$work/anon.err")"
run wrong KILN_REGISTRY_USERNAME=kiln KILN_REGISTRY_PASSWORD=wrong -- "${args[@]}" "$target" && fail "pushed with a wrong password"
grep -q 'pushing .* failed' "$work/wrong.err" || fail "no message for a wrong password: $(tail -2 "$work/wrong.err")"
run half KILN_REGISTRY_USERNAME=kiln -- "${args[@]}" "$target" && fail "accepted a user name without a password"
grep -q 'must be set together' "$work/half.err" || fail "half credentials: $(cat "$work/half.err")"

echo "== pushed with KILN_REGISTRY_USERNAME/PASSWORD; the digest is the registry's and the build's"
run env KILN_REGISTRY_USERNAME=kiln KILN_REGISTRY_PASSWORD="$password" -- "${args[@]}" --values "$work/values.yaml" "$target" ||
  fail "push with credentials from the environment: $(tail -3 "$work/env.err")"
read -r name ref <"$work/env.out"
[[ $name == operator && $ref == "$target/operator@sha256:"* ]] || fail "printed '$name $ref'"
digest=${ref#*@}
served=$(curl -fsSI -u "kiln:$password" -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
  "http://127.0.0.1:$port/v2/team/kiln/operator/manifests/t1" | tr -d '\r' | awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}')
[[ $served == "$digest" ]] || fail "registry serves t1 as $served, push-images printed $digest"
grep -qF "$digest" "$work/env.err" || fail "build-image's digest is not the pushed one: $(grep kiln-operator.tar "$work/env.err")"
python3 - "$work/values.yaml" "$target/operator" "$digest" <<'PY' || fail "values: $(cat "$work/values.yaml")"
import sys, yaml
v = yaml.safe_load(open(sys.argv[1]))
sys.exit(v != {"operator": {"image": {"repository": sys.argv[2], "tag": "t1", "digest": sys.argv[3]}}})
PY
echo "   $ref"

echo "== pushed with --authfile (as skopeo/docker login write it)"
printf '{"auths":{"localhost:%s":{"auth":"%s"}}}\n' "$port" "$(printf 'kiln:%s' "$password" | base64 -w0)" >"$work/auth.json"
run file -- "${args[@]}" --tag t2 --authfile "$work/auth.json" "$target" || fail "push with --authfile: $(tail -3 "$work/file.err")"
[[ $(cat "$work/file.out") == "operator $ref" ]] || fail "the same image pushed again has another digest: $(cat "$work/file.out")"
rm "$work/auth.json"

echo "== malformed arguments, refused before building"
for bad in "https://$target" "$target:v1" "Registry.example/kiln" "noregistry"; do
  run bad -- "${args[@]}" "$bad" && fail "accepted '$bad'"
  grep -q 'is not REGISTRY\[/PREFIX\]' "$work/bad.err" || fail "'$bad': $(cat "$work/bad.err")"
done
run bad -- --images operator,gpu "$target" && fail "accepted --images operator,gpu"
grep -q 'name operator, agent, csi, agent-gpu and/or compiler' "$work/bad.err" || fail "--images: $(cat "$work/bad.err")"
run bad -- --tag 'a b' "$target" && fail "accepted a tag with a space"
grep -q 'not a valid OCI tag' "$work/bad.err" || fail "--tag: $(cat "$work/bad.err")"

leaks >/dev/null || fail "the password appears in push-images' output: $(leaks)"
[[ -z $(find "$work" -maxdepth 1 -name 'kiln-push-images.*') ]] || fail "push-images left its work directory (with the auth file)"
echo "test-push-images passed"
