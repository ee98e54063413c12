"""A private Sigstore instance on 127.0.0.1 that signs model directories keyless.

Stands up the real upstream Sigstore servers that scripts/ensure/sigstore.sh builds, signs each
model directory KEYLESS with the real OpenSSF Model Signing CLI (`model_signing sign sigstore`,
PyPI model-signing 1.1.1 on sigstore-python 4.5.1, from scripts/ensure/model-signing.sh), checks
every bundle with the real `model_signing verify sigstore`, writes the instance's trust material,
and shuts every server down, on every exit path. One shot, for kiln's integration tests:

  $(scripts/ensure/model-signing.sh)/python scripts/test/sigstore-instance.py --dir WORK \\
      --servers "$(scripts/ensure/sigstore.sh)" \\
      --model-signing "$(scripts/ensure/model-signing.sh)" \\
      --sign MODEL_DIR=OUT.sig=publisher@example.com \\
      [--sign MODEL_DIR2=OUT2.sig=someone@else.org ...]

It leaves in WORK:
  trusted_root.json   the TrustedRoot: Fulcio's chain, the CT log's key, Rekor's key, the TSA's
                      chain
  trust_config.json   the ClientTrustConfig `model_signing --trust_config` takes: that root plus a
                      v0.2 SigningConfig naming the private Fulcio, Rekor v2, TSA and OIDC issuer
  issuer.txt          the OIDC issuer URL (the verifier's --identity_provider), no newline
  logs/               each server's output (and pki/, ct-storage/, rekor-storage/: all remade
                      on every run)
and every OUT.sig bundle. It prints one line per bundle and exits 0 only if every sign and every
verify succeeded; otherwise it prints the failing command and the tail of each server's log, and
exits 1. Servers are stopped on return, exception, SIGTERM and SIGHUP, and die with the script
even when it is killed outright (setpriv --pdeathsig). Every wait is bounded: servers must answer
their health endpoints within 60 s, each model_signing command finish within 120 s. It must run
under the model-signing environment's python (it needs `cryptography` and `jwt` from there).

The bundles are v0.3: the Fulcio certificate (its SCT embedded), one Rekor v2 entry with an
inclusion proof and checkpoint, and an RFC 3161 timestamp. Rekor v2 has no DSSE type (rekor-tiles
dropped it): sigstore-python logs the DSSE envelope as kind hashedrekord 0.0.2, whose digest is
sha256 of the envelope's PAE and whose signature is the envelope's.

The servers, all static Go binaries from their upstream releases (versions and go.sum hashes in
scripts/ensure/sigstore.sh, recorded in the bin directory's SOURCES):
  fulcio-server     github.com/sigstore/fulcio v1.8.8: the certificate authority, `--ca=fileca`
                    with a P-256 root made here, one OIDC issuer of type email (client ID sigstore)
  ct-log            github.com/transparency-dev/tesseract v0.1.1 (cmd/tesseract/posix): Fulcio's
                    CT log; Fulcio embeds its SCT in every certificate it issues
  rekor-server      github.com/sigstore/rekor-tiles/v2 v2.3.0 (cmd/rekor-server/posix): Rekor v2,
                    checkpoints signed with a P-256 key, origin 127.0.0.1 (the host of its URL, as
                    sigstore-go expects), no witness
  timestamp-server  github.com/sigstore/timestamp-authority/v2 v2.1.3: the RFC 3161 TSA, file
                    signer with a P-256 leaf (critical EKU timeStamping) under a root made here
The OIDC identity provider is the one piece that is not an upstream server: a stand-in in this
script (http.server in a thread) serving OpenID discovery and its JWKS, whose ES256 ID tokens
(iss, sub, aud sigstore, email, email_verified) this script mints itself. Fulcio only needs
discovery, the JWKS and a signed token, and no upstream IdP (Dex) is built here.

The timestamp authority serves Prometheus metrics on :2112, hard-coded (v2.1.3
pkg/server/prometheus.go), so two instances cannot run at once: runs wait for each other on a
lock file (bounded), and a run fails saying so when something else holds port 2112.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import fcntl
import hashlib
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOST = "127.0.0.1"
READY_DEADLINE_S = 60
CLI_TIMEOUT_S = 120
LOCK_DEADLINE_S = 300
TSA_METRICS_PORT = 2112
LOG_TAIL_LINES = 25
# Health checks go straight to 127.0.0.1, whatever proxy the environment names.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ORG = "kiln.test"


class Failure(Exception):
    """What went wrong and what to do about it; ends the run with exit status 1."""


# --- keys, certificates and trust material -------------------------------------------------


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def rfc3339(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def spki_der(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write_key(path: Path, key: ec.EllipticCurvePrivateKey, sec1=False, password=None) -> None:
    """PKCS#8 PEM (encrypted when a password is given), or SEC 1 "EC PRIVATE KEY" PEM."""
    formats = serialization.PrivateFormat
    fmt = formats.TraditionalOpenSSL if sec1 else formats.PKCS8
    enc = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, enc))


def make_cert(cn, key, issuer=None, *, ca: bool, eku=None, start) -> x509.Certificate:
    """A certificate for KEY named CN, signed by ISSUER (cert, key) or self-signed; 30 days."""
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    issuer_cert, issuer_key = issuer or (None, key)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key())
    usage = dict.fromkeys(("content_commitment", "key_encipherment", "data_encipherment",
                           "key_agreement", "encipher_only", "decipher_only"), False)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca, crl_sign=ca,
                                     **usage), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(aki, critical=False)
    )
    if eku:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


def pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@dataclass
class Pki:
    """Every key and certificate of the instance, written under DIR."""

    dir: Path
    start: datetime.datetime
    fulcio_root: x509.Certificate
    fulcio_password: str
    ct_key: ec.EllipticCurvePrivateKey
    rekor_key: ec.EllipticCurvePrivateKey
    tsa_chain: list[x509.Certificate]


def make_pki(root: Path) -> Pki:
    """Fulcio's root CA, the CT log's and Rekor's P-256 keys, and the TSA's leaf and root."""
    root.mkdir(parents=True)
    start = utc_now() - datetime.timedelta(minutes=5)
    fulcio_key, ct_key, rekor_key, tsa_root_key, tsa_key = (
        ec.generate_private_key(ec.SECP256R1()) for _ in range(5)
    )
    fulcio_root = make_cert("kiln-test-fulcio-root", fulcio_key, ca=True, start=start)
    tsa_root = make_cert("kiln-test-tsa-root", tsa_root_key, ca=True, start=start)
    tsa_leaf = make_cert("kiln-test-tsa", tsa_key, (tsa_root, tsa_root_key), ca=False,
                         eku=[ExtendedKeyUsageOID.TIME_STAMPING], start=start)
    password = secrets.token_hex(16)
    # Fulcio's fileca wants an encrypted key and its password; the CT log reads only SEC 1.
    write_key(root / "fulcio-root.key", fulcio_key, password=password)
    (root / "fulcio-root.pem").write_bytes(pem(fulcio_root))
    write_key(root / "ct.key", ct_key, sec1=True)
    write_key(root / "rekor.key", rekor_key)
    write_key(root / "tsa.key", tsa_key)
    (root / "tsa-chain.pem").write_bytes(pem(tsa_leaf, tsa_root))
    return Pki(root, start, fulcio_root, password, ct_key, rekor_key, [tsa_leaf, tsa_root])


def log_instance(url: str, key: ec.EllipticCurvePrivateKey, start: str) -> dict:
    """A TransparencyLogInstance: the log ID is the sha256 of the key's DER SPKI."""
    der = spki_der(key)
    return {
        "baseUrl": url,
        "hashAlgorithm": "SHA2_256",
        "publicKey": {"rawBytes": b64(der), "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                      "validFor": {"start": start}},
        "logId": {"keyId": b64(hashlib.sha256(der).digest())},
    }


def authority(cn: str, uri: str, chain: list[x509.Certificate], start: str) -> dict:
    """A CertificateAuthority: CHAIN from leaf to root."""
    return {
        "subject": {"organization": ORG, "commonName": cn},
        "uri": uri,
        "certChain": {"certificates": [
            {"rawBytes": b64(c.public_bytes(serialization.Encoding.DER))} for c in chain]},
        "validFor": {"start": start},
    }


def trusted_root(pki: Pki, urls: dict) -> dict:
    start = rfc3339(pki.start)
    return {
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [log_instance(urls["rekor"], pki.rekor_key, start)],
        "certificateAuthorities": [
            authority("kiln-test-fulcio-root", urls["fulcio"], [pki.fulcio_root], start)],
        "ctlogs": [log_instance(urls["ct"], pki.ct_key, start)],
        "timestampAuthorities": [authority("kiln-test-tsa", urls["tsa"], pki.tsa_chain, start)],
    }


def signing_config(urls: dict, start: str) -> dict:
    def service(url: str, version: int) -> list[dict]:
        return [{"url": url, "majorApiVersion": version, "validFor": {"start": start},
                 "operator": ORG}]

    return {
        "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
        "caUrls": service(urls["fulcio"], 1),
        "oidcUrls": service(urls["oidc"], 1),
        "rekorTlogUrls": service(urls["rekor"], 2),
        "tsaUrls": service(urls["tsa"], 1),
        "rekorTlogConfig": {"selector": "ANY"},
        "tsaConfig": {"selector": "ANY"},
    }


def write_trust(work: Path, pki: Pki, urls: dict) -> Path:
    """trusted_root.json, trust_config.json and issuer.txt; returns trust_config.json's path."""
    root = trusted_root(pki, urls)
    config = {
        "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
        "trustedRoot": root,
        "signingConfig": signing_config(urls, rfc3339(pki.start)),
    }
    (work / "trusted_root.json").write_text(json.dumps(root, indent=2) + "\n")
    (work / "trust_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (work / "issuer.txt").write_text(urls["oidc"])
    return work / "trust_config.json"


# --- the stand-in OIDC identity provider ----------------------------------------------------


class Idp:
    """OpenID discovery and JWKS on 127.0.0.1, and ES256 ID tokens for any email."""

    def __init__(self, log: Path):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.kid = secrets.token_hex(8)
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = {"keys": [dict(jwk, kid=self.kid, alg="ES256", use="sig")]}
        self.log = log.open("a", buffering=1)
        self.server = http.server.ThreadingHTTPServer((HOST, 0), self.handler())
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def discovery(self) -> dict:
        return {
            "issuer": self.url,
            "jwks_uri": self.url + "/keys",
            # sigstore-python's Issuer insists on these two, though nothing here uses them.
            "authorization_endpoint": self.url + "/auth",
            "token_endpoint": self.url + "/token",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        }

    def handler(self):
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = {"/.well-known/openid-configuration": idp.discovery(),
                        "/keys": idp.jwks}.get(self.path)
                data = json.dumps(body).encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args):
                idp.log.write("%s %s\n" % (self.log_date_time_string(), format % args))

        return Handler

    def mint(self, email: str) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "sub": email, "aud": "sigstore", "email": email,
                  "email_verified": True, "iat": now, "exp": now + 600}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})

    def __enter__(self) -> "Idp":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.log.close()


# --- the servers ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


@dataclass
class Server:
    name: str
    argv: list[str]
    health: str
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        # setpriv: the server dies with this script even when it is killed with SIGKILL.
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "--", *self.argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def wait_ready(self, deadline: float) -> None:
        """Polls the health endpoint until it answers 200; fails when the server exits."""
        while True:
            if self.proc.poll() is not None:
                raise Failure(f"{self.name} exited with status {self.proc.returncode} "
                              f"before it was ready ({' '.join(self.argv)})")
            with contextlib.suppress(OSError, http.client.HTTPException):
                with DIRECT.open(self.health, timeout=2) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise Failure(f"{self.name} did not answer {self.health} within "
                              f"{READY_DEADLINE_S} s")
            time.sleep(0.2)


def servers(bin_dir: Path, work: Path, pki: Pki, oidc_url: str) -> tuple[list[Server], dict]:
    """The four servers' command lines on fresh ports, and the instance's URLs."""
    fulcio, ct, rekor, tsa = (free_port() for _ in range(4))
    urls = {"fulcio": f"http://{HOST}:{fulcio}", "ct": f"http://{HOST}:{ct}",
            "rekor": f"http://{HOST}:{rekor}", "tsa": f"http://{HOST}:{tsa}/api/v1/timestamp",
            "oidc": oidc_url}
    fulcio_config = pki.dir / "fulcio-config.json"
    fulcio_config.write_text(json.dumps({"OIDCIssuers": {oidc_url: {
        "IssuerURL": oidc_url, "ClientID": "sigstore", "Type": "email"}}}))
    logs, pki_dir = work / "logs", pki.dir
    # Not Fulcio's single-port "duplex" mode: in v1.8.8 it panics registering its gRPC
    # metrics twice. Its legacy gRPC socket (abstract) is named per run.
    fulcio_argv = [
        str(bin_dir / "fulcio-server"), "serve", f"--host={HOST}", f"--port={fulcio}",
        f"--grpc-host={HOST}", f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
        f"--legacy-unix-domain-socket=@kiln-fulcio-{os.getpid()}-{fulcio}",
        "--ca=fileca", f"--fileca-cert={pki_dir / 'fulcio-root.pem'}",
        f"--fileca-key={pki_dir / 'fulcio-root.key'}",
        f"--fileca-key-passwd={pki.fulcio_password}", "--fileca-watch=false",
        f"--ct-log-url={urls['ct']}", f"--config-path={fulcio_config}", "--log_type=prod"]
    ct_argv = [
        str(bin_dir / "ct-log"), f"--private_key={pki_dir / 'ct.key'}",
        f"--origin={HOST}", f"--storage_dir={work / 'ct-storage'}",
        f"--roots_pem_file={pki_dir / 'fulcio-root.pem'}", "--ext_key_usages=CodeSigning",
        f"--http_endpoint={HOST}:{ct}"]
    rekor_argv = [
        str(bin_dir / "rekor-server"), "serve", f"--http-address={HOST}", f"--http-port={rekor}",
        f"--grpc-address={HOST}", f"--grpc-port={free_port()}",
        f"--http-metrics-port={free_port()}", f"--hostname={HOST}",
        f"--storage-dir={work / 'rekor-storage'}", f"--signer-filepath={pki_dir / 'rekor.key'}",
        "--checkpoint-interval=1s"]
    tsa_argv = [
        str(bin_dir / "timestamp-server"), "serve", f"--host={HOST}", f"--port={tsa}",
        "--timestamp-signer=file", f"--file-signer-key-path={pki_dir / 'tsa.key'}",
        f"--certificate-chain-path={pki_dir / 'tsa-chain.pem'}", "--disable-ntp-monitoring",
        "--log-type=prod"]
    return [
        Server("fulcio", fulcio_argv, urls["fulcio"] + "/healthz", logs / "fulcio.log"),
        Server("ct-log", ct_argv, urls["ct"] + "/healthz", logs / "ct-log.log"),
        Server("rekor", rekor_argv, urls["rekor"] + "/healthz", logs / "rekor.log"),
        Server("tsa", tsa_argv, f"http://{HOST}:{tsa}/ping", logs / "tsa.log"),
    ], urls


@contextlib.contextmanager
def tsa_metrics_port_lock():
    """Holds the lock of port 2112 (see the docstring); fails when another program has it."""
    path = Path(tempfile.gettempdir()) / "kiln-sigstore-instance.lock"
    deadline = time.monotonic() + LOCK_DEADLINE_S
    with path.open("a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Failure(f"another instance held {path} for {LOCK_DEADLINE_S} s")
                time.sleep(0.5)
        if port_in_use(TSA_METRICS_PORT):
            raise Failure(f"port {TSA_METRICS_PORT} is in use, and the timestamp server "
                          "always binds it for metrics: stop what listens there")
        yield


# --- signing and verifying ------------------------------------------------------------------


@dataclass
class Job:
    model: Path
    out: Path
    email: str


def parse_job(spec: str) -> Job:
    model, out, email = spec.rsplit("=", 2) if spec.count("=") >= 2 else (spec, "", "")
    if not (model and out and "@" in email):
        raise argparse.ArgumentTypeError(f"{spec!r} is not MODEL_DIR=OUT.sig=EMAIL")
    return Job(Path(model).resolve(), Path(out).resolve(), email)


def cli_env() -> dict:
    """This environment, with 127.0.0.1 kept away from any HTTP proxy."""
    env = dict(os.environ)
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = ",".join(filter(None, [env.get(name), HOST, "localhost"]))
    return env


def run_cli(argv: list[str], shown: list[str]) -> None:
    """Runs a model_signing command; SHOWN is its argv as printed (the token left out)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=CLI_TIMEOUT_S, env=cli_env())
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(shown)}: no answer within {CLI_TIMEOUT_S} s")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
        raise Failure(f"{' '.join(shown)} failed with status {done.returncode}:\n{tail}")


def sign_and_verify(cli: Path, trust_config: Path, idp: Idp, job: Job) -> None:
    common = ["--trust_config", str(trust_config), "--signature", str(job.out)]
    sign = [str(cli), "sign", "sigstore", *common]
    job.out.parent.mkdir(parents=True, exist_ok=True)
    run_cli([*sign, "--identity_token", idp.mint(job.email), str(job.model)],
            [*sign, "--identity_token", f"<ID token for {job.email}>", str(job.model)])
    verify = [str(cli), "verify", "sigstore", *common, "--identity", job.email,
              "--identity_provider", idp.url, str(job.model)]
    run_cli(verify, verify)


# --- the run --------------------------------------------------------------------------------


def log_tails(logs: Path) -> str:
    parts = []
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        parts.append(f"--- {log} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(parts)


def check_tools(bin_dir: Path, cli: Path) -> None:
    for name in ("fulcio-server", "ct-log", "rekor-server", "timestamp-server"):
        if not os.access(bin_dir / name, os.X_OK):
            raise Failure(f"{bin_dir / name} is missing: run scripts/ensure/sigstore.sh")
    if not os.access(cli, os.X_OK):
        raise Failure(f"{cli} is missing: run scripts/ensure/model-signing.sh")
    if not shutil.which("setpriv"):
        raise Failure("setpriv is missing (Debian: util-linux)")


def fresh_work_dir(work: Path) -> None:
    """Removes what an earlier run left in WORK; keeps anything else there."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("logs", "pki", "ct-storage", "rekor-storage"):
        shutil.rmtree(work / name, ignore_errors=True)
    for name in ("trusted_root.json", "trust_config.json", "issuer.txt"):
        (work / name).unlink(missing_ok=True)
    (work / "logs").mkdir()


def run_instance(args: argparse.Namespace) -> None:
    work, bin_dir, cli = args.dir, args.servers, args.model_signing / "model_signing"
    check_tools(bin_dir, cli)
    fresh_work_dir(work)
    pki = make_pki(work / "pki")
    with tsa_metrics_port_lock(), Idp(work / "logs" / "oidc.log") as idp:
        procs, urls = servers(bin_dir, work, pki, idp.url)
        try:
            for server in procs:
                server.start()
            deadline = time.monotonic() + READY_DEADLINE_S
            for server in procs:
                server.wait_ready(deadline)
            trust_config = write_trust(work, pki, urls)
            for job in args.sign:
                sign_and_verify(cli, trust_config, idp, job)
                print(f"signed {job.model} as {job.email} -> {job.out}: verified", flush=True)
        finally:
            for server in procs:
                server.stop()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True,
                        help="work directory: trust material, logs, server storage")
    parser.add_argument("--servers", type=Path, required=True,
                        help="bin directory of scripts/ensure/sigstore.sh")
    parser.add_argument("--model-signing", type=Path, required=True,
                        help="bin directory of scripts/ensure/model-signing.sh")
    parser.add_argument("--sign", type=parse_job, action="append", required=True,
                        metavar="MODEL_DIR=OUT.sig=EMAIL", help="sign MODEL_DIR as EMAIL")
    args = parser.parse_args(argv)
    args.dir = args.dir.resolve()
    return args


def exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_signal)
    signal.signal(signal.SIGHUP, exit_on_signal)
    try:
        run_instance(args)
    except Failure as failure:
        print(f"sigstore-instance: {failure}", file=sys.stderr)
        logs = args.dir / "logs"
        if logs.is_dir():
            print(log_tails(logs), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
