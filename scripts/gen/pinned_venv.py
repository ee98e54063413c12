"""Runs a script in its own virtual environment of pinned PyPI packages (stdlib only): the
generators of the size benchmarks (llama-gguf.py, onnx-large.py beside it) call `reexec` first.
The venv lives in $KILN_CACHE_DIR/NAME (default /var/cache/kiln as root, ~/.cache/kiln
otherwise), is made once (pip needs PyPI that once), checked by asking each package's installed
version, and made again when one differs."""
import os
import subprocess
import sys


def cache_dir():
    d = os.environ.get("KILN_CACHE_DIR")
    if d:
        return d
    if os.geteuid() == 0:
        return "/var/cache/kiln"
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kiln")


def reexec(tool, name, pins, script):
    """Re-executes `script` (its argv kept) under the venv NAME holding `pins` ({distribution:
    version}) unless already there; exits with `tool`'s message when it cannot be made."""
    venv = os.path.join(cache_dir(), name)
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    check = "import importlib.metadata as m; " + "; ".join(
        f"assert m.version({d!r}) == {v!r}" for d, v in pins.items())
    if not (os.path.exists(py) and subprocess.run([py, "-c", check], capture_output=True).returncode == 0):
        subprocess.run(["rm", "-rf", venv], check=True)
        os.makedirs(os.path.dirname(venv), exist_ok=True)
        if subprocess.run([sys.executable, "-m", "venv", venv], stdout=sys.stderr).returncode != 0:
            sys.exit(f"{tool}: python3 -m venv failed (Debian: python3-venv)")
        wanted = [f"{d}=={v}" for d, v in pins.items()]
        r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted],
                           stdout=sys.stderr)
        if r.returncode != 0:
            sys.exit(f"{tool}: pip install {' '.join(wanted)} failed (PyPI is needed once)")
    os.execv(py, [py, os.path.abspath(script)] + sys.argv[1:])
