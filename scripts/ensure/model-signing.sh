#!/usr/bin/env bash
# Installs the real OpenSSF Model Signing CLI, `model_signing` (PyPI `model-signing` 1.1.1, with
# sigstore-python 4.5.1 under it), that the tests sign models with and check kiln's verifier
# against. Every one of its 36 distributions is pinned by version and by the sha256 of the wheel
# pip picks for Debian's own Python (/usr/bin/python3, CPython 3.11) on x86-64 (pip checks them:
# --require-hashes, --no-deps, wheels only), in a virtual environment kept outside the work tree
# ($KILN_CACHE_DIR/model-signing-1.1.1, default /var/cache/kiln as root, ~/.cache/kiln otherwise).
# Prints the environment's bin directory (it holds `model_signing` and `python`).
# Idempotent: the question asked is whether `model_signing --help` runs there, `pip show
# model-signing` says 1.1.1 and the environment was installed from this very pin list; only then
# is nothing installed. About 17 s and 95 MB on first use, under a lock; exit status 1, with
# the reason on stderr, when PyPI cannot be reached then.
#
#   scripts/ensure/model-signing.sh        # prints .../model-signing-1.1.1/bin
#   "$(scripts/ensure/model-signing.sh)/model_signing" verify key --signature model.sig \
#     --public-key key.pub MODEL_DIR
#
# The pins are `pip install --dry-run --report` of `model-signing==1.1.1 pyopenssl` into an empty
# environment of /usr/bin/python3 (the newest of each dependency that day). Bumping one: do that
# again and copy each distribution's version and archive sha256 from the report.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
. "$(dirname "$(readlink -f "$0")")/../lib.sh"
TOOL=ensure-model-signing

VERSION=1.1.1
PYTHON=/usr/bin/python3
PINS=(
  "model-signing==$VERSION --hash=sha256:98eeb28bad960d7a3728045d0d3e424afcaba1740792c6d31a6afbc269bf28e7"
  "sigstore==4.5.1 --hash=sha256:02e000197b34980f1d382741d6f83c2fecbcef7debf7304f36a5253f3c892cd9"
  "sigstore-models==0.0.6 --hash=sha256:5201a68f4d7d0f8bec1e2f4378eb646b084c52609a4e31db8c385095fff68b2e"
  "sigstore-rekor-types==0.0.18 --hash=sha256:b62bf38c5b1a62bc0d7fe0ee51a0709e49311d137c7880c329882a8f4b2d1d78"
  "cryptography==50.0.2 --hash=sha256:9dab55f57c74c3cad24c323bacbbd04be4705ba6eb0d92e920b1fc4837ed5079"
  "typing-extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"
  "asn1crypto==1.5.1 --hash=sha256:db4e40728b728508912cbb3d44f19ce188f218e9eba635821bb4b68564f8fd67"
  "blake3==1.0.11 --hash=sha256:fe624bb87ee53d9770bec087631d7fd8f01eab0128693b8fe6b884d8c2cf0989"
  "click==8.5.1 --hash=sha256:8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37"
  "in-toto-attestation==0.9.3 --hash=sha256:1f44d3f3bded1ed551e260c5e9f834ee05de03f1d2f360bada5a172c11d748ff"
  "cffi==2.1.1 --hash=sha256:34e261f78cb6ceaaa36f42f2613f4380d94d9c759a9c73c769ee6e0247364632"
  "id==1.6.1 --hash=sha256:f5ec41ed2629a508f5d0988eda142e190c9c6da971100612c4de9ad9f9b237ca"
  "platformdirs==4.14.8 --hash=sha256:1e34af590de4d978631b751eb2202f2fee4497537a17c1720b12fcf57b331392"
  "pydantic==2.14.4 --hash=sha256:653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"
  "pydantic-core==2.50.5 --hash=sha256:488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70"
  "pyjwt==2.15.1 --hash=sha256:42d59d631f7768a1028a64c7ff581a9bf7519804daf91fc5b6c56e30eec5e193"
  "rfc3161-client==1.0.9 --hash=sha256:fac3f440a507555e684dc5daba75e33dc08f0f45fdefa48448f19001233a6b21"
  "rfc8785==0.1.4 --hash=sha256:520d690b448ecf0703691c76e1a34a24ddcd4fc5bc41d589cb7c58ec651bcd48"
  "rich==15.0.0 --hash=sha256:33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"
  "tuf==7.0.1 --hash=sha256:d30434bda6e079ab303fb30d1b3006d939a10ca34783b1573d61cd9b802fa45c"
  "protobuf==7.36.2 --hash=sha256:89f23aa53c24553a2416fd4fd1ec06f74fa42b14b546d8883128813f775bbfd2"
  "requests==2.34.2 --hash=sha256:2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0"
  "annotated-types==0.8.0 --hash=sha256:f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"
  "certifi==2026.10.19.post1 --hash=sha256:1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2"
  "charset-normalizer==3.5.3 --hash=sha256:2a6f937e0b70133d1f826d0a253331b6fe1a4c874808cc12e16f2fb8177042f4"
  "idna==3.20 --hash=sha256:ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c"
  "markdown-it-py==4.3.0 --hash=sha256:7aa1511a46c39138de78d9eba92ce47e63124d8003fc98b3a351909e04239efa"
  "pygments==2.21.0 --hash=sha256:2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"
  "securesystemslib==1.6.0 --hash=sha256:1c1aa00f058f4851f038d409c8ca4a727db854a91f07ec3a0fa047bb93e43e0e"
  "typing-inspection==0.4.5 --hash=sha256:bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"
  "urllib3==2.8.0 --hash=sha256:0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3"
  "pycparser==3.12 --hash=sha256:a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e"
  "email-validator==2.4.0 --hash=sha256:4454e41c4e1c6b6caee34a1dc71d5e736791562be8fd179b02e298f796522684"
  "mdurl==0.1.2 --hash=sha256:84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8"
  "dnspython==2.9.2 --hash=sha256:af15f7d385a6ae2fb35a796fde2138004c8c42c7389090e2addc83e3b3340fd8"
  # Not declared by model-signing 1.1.1, but model_signing/_signing/sign_certificate.py imports
  # `from OpenSSL import crypto` at import time: without it the CLI does not even print --help.
  "pyopenssl==26.4.0 --hash=sha256:f0eb0cb2d581d3ad2b9c489468485e7f2ab6727d08401bcf9d824c3caddf3c1c"
)

cache=$(kiln_cache_dir)
venv=$cache/model-signing-$VERSION
# The pin list the environment was installed from, kept in it: another list reinstalls.
pins=$(printf '%s\n' "${PINS[@]}")
installed() {
  [[ -x $venv/bin/model_signing && $(cat "$venv/kiln-pins.txt" 2>/dev/null) == "$pins" ]] &&
    "$venv/bin/model_signing" --help >/dev/null 2>&1 &&
    [[ $("$venv/bin/python" -m pip show model-signing 2>/dev/null | sed -n 's/^Version: //p') == "$VERSION" ]]
}

if installed; then
  echo "$venv/bin"
  exit 0
fi
[[ -x $PYTHON ]] || die "$PYTHON is missing (Debian: python3, python3-venv)"
# The wheels' sha256 are those of CPython 3.11 on x86-64 (cryptography, cffi, pydantic-core,
# blake3, protobuf, rfc3161-client and charset-normalizer are built per platform).
[[ $(uname -m) == x86_64 ]] || die "only the x86-64 wheels are pinned; this machine is $(uname -m)"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.11 ]] || die "the wheels pinned are CPython 3.11's; $PYTHON is $pyver"
mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9
# Another run may have installed it while this one waited for the lock.
if installed; then
  echo "$venv/bin"
  exit 0
fi
echo "$TOOL: installing model-signing $VERSION and its 35 pinned dependencies into $venv (about 17 s, once)" >&2
rm -rf "$venv"
"$PYTHON" -m venv "$venv" >&2 || die "$PYTHON -m venv failed (Debian: python3-venv)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes -r <(echo "$pins") >&2 || die "pip install model-signing==$VERSION failed (PyPI is needed once)"
"$venv/bin/python" -m pip check >&2 || die "the pinned set does not satisfy its own requirements"
echo "$pins" >"$venv/kiln-pins.txt"
installed || die "$venv/bin/model_signing --help does not run, or pip does not show model-signing $VERSION"
echo "$venv/bin"
