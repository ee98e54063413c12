#!/usr/bin/env python3
"""The Containerfile gives the images scripts/build-images.sh gives, without building it.

Building the Containerfile needs a container builder and network access to a base image's
registry; this check needs neither, and runs the Containerfile's own steps instead. For each
image stage (`FROM scratch AS NAME`): the stage it copies from must run
`scripts/build-images.sh --rootfs --images NAME /out`; that command is run here as written
(with /out in a temporary directory and the binaries under test), its layer directories must be
copied by the stage's COPY lines, each once and in order, and what they hold (paths, types,
modes, sizes, sha256, link targets) must equal the layers of the OCI archive that
scripts/build-images.sh writes for scripts/push-images.sh and the e2e tests. The stage's ENV,
WORKDIR, USER and ENTRYPOINT lines must give that image's config (Env in order, WorkingDir,
User, Entrypoint). So a change to the recipe that the Containerfile does not follow fails here.

  scripts/check/containerfile.py [--images operator,agent,csi] [--operator-bin F] [--agent-bin F]
                                 [--csi-bin F]

Binaries: the newer of target/release and target/debug unless given. agent-gpu is checked only
when named (it fetches 1.2 GB once, scripts/ensure/onnxruntime-gpu.sh, and gzips 1.6 GB: about
two minutes).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def instructions(path):
    """(keyword, argument) of each instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in open(path):
        line = line.rstrip("\n")
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, arg = line.strip().partition(" ")
        out.append((keyword.upper(), arg.strip()))
    return out


def stages(path):
    """name -> {"from": base, "steps": [(keyword, argument)]}."""
    result, current = {}, None
    for keyword, arg in instructions(path):
        if keyword == "FROM":
            words = arg.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(result)}"
            current = result[name] = {"from": words[0], "steps": []}
        elif current is not None:
            current["steps"].append((keyword, arg))
    return result


def image_stage(stage):
    """COPY sources (stage, path), and the config the stage's lines give."""
    copies, env, config = [], [], {"WorkingDir": "", "User": "", "Entrypoint": None}
    for keyword, arg in stage["steps"]:
        if keyword == "COPY":
            words = arg.split()
            if len(words) != 3 or not words[0].startswith("--from=") or words[2] != "/":
                raise SystemExit(f"COPY {arg!r}: expected COPY --from=STAGE /out/kiln-NAME/N/ /")
            copies.append((words[0][len("--from="):], words[1]))
        elif keyword == "ENV":
            key, sep, value = arg.partition("=")
            if not sep or " " in value:
                raise SystemExit(f"ENV {arg!r}: write one KEY=VALUE per ENV line")
            env.append(f"{key}={value}")
        elif keyword == "WORKDIR":
            config["WorkingDir"] = arg
        elif keyword == "USER":
            config["User"] = arg
        elif keyword == "ENTRYPOINT":
            config["Entrypoint"] = json.loads(arg)
        else:
            raise SystemExit(f"{keyword} in an image stage: the check knows COPY, ENV, WORKDIR, USER, ENTRYPOINT")
    config["Env"] = env
    return copies, config


def tree(root):
    """path -> (type, mode, size, sha256 or link target) of everything under root."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ("link", 0o777, 0, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ("dir", stat.S_IMODE(st.st_mode), 0, "")
            else:
                with open(full, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                entries[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_size, digest)
    return entries


def archive(path):
    """(layers, config) of an OCI archive: each layer as tree() gives a directory."""
    with tarfile.open(path) as outer:
        read = lambda name: outer.extractfile(name).read()
        index = json.loads(read("index.json"))
        manifest = json.loads(read("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
        config = json.loads(read("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
        layers = []
        for layer in manifest["layers"]:
            data = outer.extractfile("blobs/sha256/" + layer["digest"].split(":")[1])
            entries = {}
            with tarfile.open(fileobj=gzip.GzipFile(fileobj=data), mode="r|") as t:
                for m in t:
                    if m.isdir():
                        entries[m.name] = ("dir", m.mode, 0, "")
                    elif m.issym():
                        entries[m.name] = ("link", 0o777, 0, m.linkname)
                    else:
                        digest = hashlib.file_digest(t.extractfile(m), "sha256").hexdigest()
                        entries[m.name] = ("file", m.mode, m.size, digest)
            layers.append(entries)
    return layers, config["config"]


def newest(name):
    found = [p for p in (f"{REPO}/target/release/{name}", f"{REPO}/target/debug/{name}") if os.access(p, os.X_OK)]
    if not found:
        raise SystemExit(f"{name} not built: cargo build -p {name}, or --{name.split('-')[1]}-bin")
    return max(found, key=os.path.getmtime)


def differences(want, got, what):
    errors = []
    for path in sorted(set(want) | set(got)):
        if want.get(path) != got.get(path):
            errors.append(f"{what} {path}: image {want.get(path)}, Containerfile {got.get(path)}")
    return errors


def check(name, all_stages, binaries, work):
    """Errors of image stage `name`."""
    copies, config = image_stage(all_stages[name])
    root_stages = {stage for stage, _ in copies}
    if len(root_stages) != 1:
        return [f"{name}: copies from {sorted(root_stages)}, expected one stage"]
    root = all_stages[root_stages.pop()]
    runs = [arg for keyword, arg in root["steps"] if keyword == "RUN"]
    want_run = ["scripts/build-images.sh", "--rootfs", "--images", name, "/out"]
    if len(runs) != 1 or shlex.split(runs[0]) != want_run:
        return [f"{name}: its root stage runs {runs}, expected [{shlex.join(want_run)!r}]"]
    out = os.path.join(work, name)
    argv = ["scripts/build-images.sh", "--rootfs", "--images", name, out] + binaries
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    built = os.path.join(out, f"kiln-{name}")
    layer_dirs = sorted((d for d in os.listdir(built) if d.isdigit()), key=int)
    wanted_copies = [f"/out/kiln-{name}/{d}/" for d in layer_dirs]
    if [src for _, src in copies] != wanted_copies:
        return [f"{name}: COPY {[src for _, src in copies]}, expected {wanted_copies} (one per layer, in order)"]
    oci = os.path.join(work, f"{name}-oci")
    subprocess.run(["scripts/build-images.sh", "--images", name, oci] + binaries,
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    layers, image_config = archive(os.path.join(oci, f"kiln-{name}.tar"))
    errors = []
    if len(layers) != len(layer_dirs):
        errors.append(f"{name}: the image has {len(layers)} layers, --rootfs wrote {len(layer_dirs)}")
    for i, (layer, d) in enumerate(zip(layers, layer_dirs)):
        errors += differences(layer, tree(os.path.join(built, d)), f"{name} layer {i}")
    rootfs_config = json.load(open(os.path.join(built, "config.json")))
    for key in ("Env", "Entrypoint", "User", "WorkingDir"):
        if image_config.get(key) != config[key]:
            errors.append(f"{name}: {key} is {image_config.get(key)!r} in the image, {config[key]!r} in the Containerfile")
        if rootfs_config.get(key) != image_config.get(key):
            errors.append(f"{name}: {key} of --rootfs's config.json differs from the image's")
    return errors


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default="operator,agent,csi")
    p.add_argument("--operator-bin")
    p.add_argument("--agent-bin")
    p.add_argument("--csi-bin")
    a = p.parse_args()
    all_stages = stages(os.path.join(REPO, "Containerfile"))
    binaries = ["--operator-bin", a.operator_bin or newest("kiln-operator"),
                "--agent-bin", a.agent_bin or newest("kiln-agent"),
                "--csi-bin", a.csi_bin or newest("kiln-csi")]
    errors = []
    with tempfile.TemporaryDirectory(prefix="kiln-containerfile-", dir="/var/tmp") as work:
        for name in a.images.split(","):
            if all_stages.get(name, {}).get("from") != "scratch":
                errors.append(f"Containerfile: no stage 'FROM scratch AS {name}'")
                continue
            found = check(name, all_stages, binaries, work)
            errors += found
            print(f"check-containerfile: {name}: {'differs' if found else 'same files, modes and config as the image'}")
    for e in errors:
        print(f"check-containerfile: {e}", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
