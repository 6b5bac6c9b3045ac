"""The official Node.js RabbitMQ stream client (``rabbitmq-stream-js-client``), for the
end-to-end tests in ``tests/clients``.

Node.js and npm come from the system (``dev.py`` installs Debian's ``nodejs`` and ``npm``
when they are missing). The client is pinned by ``tests/clients/node/package-lock.json``
(exact versions and integrity hashes) and installed with ``npm ci`` once per machine into
``.node/<lock hash>/`` at the repository root (git-ignored); a changed lock file installs
afresh. Without Node.js, or when npm cannot reach its registry, the tests fail with the
reason: a client matrix that silently shrinks proves nothing.

Fixture: ``node_client_modules`` (session): the ``node_modules`` directory holding the
client, for ``TIERLOG_NODE_MODULES`` of the scripts in ``tests/clients/node``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "clients" / "node"
CACHE = ROOT / ".node"
PACKAGE = "rabbitmq-stream-js-client"
INSTALL_TIMEOUT_S = 300.0


def node_executable() -> str:
    """``node``, or a test failure that says how to get it."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "Node.js is not installed: `python3 dev.py test` installs Debian's nodejs and npm "
            "(or: apt-get install nodejs npm)"
        )
    return node


def _lock_digest() -> str:
    data = (NODE_DIR / "package.json").read_bytes() + (NODE_DIR / "package-lock.json").read_bytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _install(target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: `python3 dev.py test` installs Debian's npm")
    staging = Path(tempfile.mkdtemp(prefix="install-", dir=CACHE))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_DIR / name, staging / name)
        command = [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"]
        try:
            done = subprocess.run(
                command, cwd=staging, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"npm ci of {PACKAGE} took over {INSTALL_TIMEOUT_S:.0f} s: registry slow?")
        if done.returncode != 0:
            pytest.fail(
                f"npm could not install {PACKAGE} (is the npm registry reachable?):\n"
                f"{done.stderr[-2000:]}"
            )
        staging.rename(target)  # whole, or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@pytest.fixture(scope="session")
def node_client_modules() -> Path:
    """The ``node_modules`` directory with the pinned Node.js client, installed on first use
    (one installer at a time across test processes: a lock file)."""
    node_executable()
    CACHE.mkdir(exist_ok=True)
    target = CACHE / _lock_digest()
    modules = target / "node_modules"
    if not (modules / PACKAGE / "package.json").exists():
        with open(CACHE / "install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not (modules / PACKAGE / "package.json").exists():
                    with contextlib.suppress(FileNotFoundError):
                        shutil.rmtree(target)
                    _install(target)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return modules
