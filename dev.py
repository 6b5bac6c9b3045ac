#!/usr/bin/env python3
"""One entry point for newcomers and CI: set everything up, then run or test tierlog.

    python3 dev.py run    # venv + package, then the quickstart on embedded defaults
    python3 dev.py test   # venv + package + test servers, then the whole test suite

Needs only Python >= 3.11. System packages (Java 17 for Spark, etcd for the MetaStore
contract tests, faketime for the delayed-delivery clock tests, Node.js and npm for the
Node.js client's end-to-end tests) are installed with apt-get when missing and we are root.
The Node.js client itself is installed by the tests (tests/plugins/node_client.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
APT_PACKAGES = {
    "java": "openjdk-17-jre-headless",
    "etcd": "etcd-server",
    "faketime": "faketime",  # delayed delivery's clock-step tests
    "node": "nodejs",  # the Node.js client's end-to-end tests (tests/clients)
    "npm": "npm",
}


def sh(*cmd: str | Path, **kw: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)  # type: ignore[call-overload]


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit("tierlog needs Python >= 3.11")
    if not PY.exists():
        sh(sys.executable, "-m", "venv", VENV)
    stamp = VENV / f".installed-{extras}"
    pyproject = ROOT / "pyproject.toml"
    if stamp.exists() and stamp.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    sh(PY, "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]")
    stamp.touch()


def java_ok() -> bool:
    java = shutil.which("java")
    if not java:
        return False
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    for token in out.replace('"', " ").split():
        if token[:2].isdigit() or token[:1].isdigit():
            major = token.split(".")[0]
            if major.isdigit():
                return int(major) >= 17
    return False


def apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"warning: cannot install {packages} (need root + apt-get)", flush=True)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh("apt-get", "update", "-q", env=env)
    sh("apt-get", "install", "-y", "-q", "--no-install-recommends", *packages, env=env)


def ensure_system() -> None:
    missing = []
    if not java_ok():
        missing.append(APT_PACKAGES["java"])
    if not shutil.which("etcd") and not Path("/usr/bin/etcd").exists():
        missing.append(APT_PACKAGES["etcd"])
    if not shutil.which("faketime"):
        missing.append(APT_PACKAGES["faketime"])
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            missing.append(APT_PACKAGES[tool])
    if missing:
        apt_install(*missing)


def cmd_run(args: list[str]) -> int:
    ensure_venv("server,s3")
    return subprocess.call([str(VENV / "bin" / "tierlog"), "quickstart", *args])


def cmd_test(args: list[str]) -> int:
    ensure_system()
    ensure_venv("dev")
    env = dict(os.environ)
    env.setdefault("HYPOTHESIS_PROFILE", "ci" if env.get("CI") else "dev")
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    rc = subprocess.call([str(PY), "-m", "pytest", *args], cwd=ROOT, env=env)
    return 0 if rc == 0 else rc


def main() -> int:
    commands = {"run": cmd_run, "test": cmd_test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
