"""A private, throw-away RabbitMQ node with the stream plugin, for fixtures and benchmarks.

Debian's ``rabbitmq-server`` is installed with apt-get when missing. The node runs entirely
under a temporary directory: its own node name, Erlang cookie (via ``HOME``), data, logs,
config and enabled-plugins files, its own ``epmd`` on a free port, and free loopback ports for
AMQP, distribution and the stream protocol. It never touches a system-wide RabbitMQ, so
several nodes (other helpers, benchmarks) can run on one machine at the same time.

Usage::

    from rabbitmq_node import rabbitmq_node

    with rabbitmq_node() as node:
        host, stream_port, data_dir, nodename = node
        ...  # connect with rstream to (host, stream_port); streams live in node.stream_dir

Run ``python scripts/rabbitmq_node.py`` to start a node, print its coordinates and stop it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

LOOPBACK = "127.0.0.1"
_SBIN_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"


class RabbitMQNodeError(RuntimeError):
    """The node could not be installed, started or stopped."""


class RabbitMQNode(NamedTuple):
    """Where a running private node can be reached and where it keeps its data."""

    host: str
    stream_port: int
    data_dir: Path
    """The node's data directory (RABBITMQ_MNESIA_DIR); streams live in ``stream_dir``."""
    nodename: str

    @property
    def stream_dir(self) -> Path:
        """Osiris data directory: one ``{vhost}_{name}_{timestamp-ns}`` directory per stream."""
        return self.data_dir / "stream"


def _find_sbin() -> Path | None:
    candidates = sorted(glob.glob(_SBIN_GLOB))
    for candidate in reversed(candidates):
        if (Path(candidate) / "rabbitmq-server").exists():
            return Path(candidate)
    return None


def ensure_rabbitmq_installed() -> Path:
    """Return RabbitMQ's ``sbin`` directory, installing Debian ``rabbitmq-server`` if missing."""
    sbin = _find_sbin()
    if sbin is not None and shutil.which("epmd") is not None:
        return sbin
    if os.geteuid() != 0:
        raise RabbitMQNodeError("rabbitmq-server is not installed and we are not root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "rabbitmq-server"],
    ):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RabbitMQNodeError(
                f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr[-2000:]}"
            )
    sbin = _find_sbin()
    if sbin is None or shutil.which("epmd") is None:
        raise RabbitMQNodeError("rabbitmq-server installed but its scripts or epmd are missing")
    return sbin


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so they differ)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1.0):
        return True
    return False


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _config_text(amqp_port: int, dist_port: int, stream_port: int) -> str:
    return "\n".join(
        [
            f"listeners.tcp.1 = {LOOPBACK}:{amqp_port}",
            f"distribution.listener.interface = {LOOPBACK}",
            f"distribution.listener.port_range.min = {dist_port}",
            f"distribution.listener.port_range.max = {dist_port}",
            f"stream.listeners.tcp.1 = {LOOPBACK}:{stream_port}",
            f"stream.advertised_host = {LOOPBACK}",
            f"stream.advertised_port = {stream_port}",
            # guest/guest stays usable, but only from loopback (RabbitMQ's default, made explicit).
            "loopback_users.guest = true",
            "log.console = false",
            "log.file.level = info",
            "",
        ]
    )


def _node_env(base: Path, nodename: str, epmd_port: int, dist_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(
        HOME=str(base),  # the Erlang cookie lives in $HOME/.erlang.cookie
        ERL_EPMD_PORT=str(epmd_port),
        RABBITMQ_NODENAME=nodename,
        RABBITMQ_USE_LONGNAME="false",
        RABBITMQ_BASE=str(base),
        RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
        RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_MNESIA_DIR=str(base / "mnesia" / nodename),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_PID_FILE=str(base / "rabbitmq.pid"),
        RABBITMQ_DIST_PORT=str(dist_port),
    )
    return env


def _start_epmd(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    epmd = shutil.which("epmd")
    if epmd is None:
        raise RabbitMQNodeError("epmd not found")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [epmd, "-port", str(port), "-address", LOOPBACK],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 20
    while not _port_open(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            _terminate(proc)
            raise RabbitMQNodeError(f"epmd on port {port} did not start: {_tail(log)}")
        time.sleep(0.1)
    return proc


def _terminate(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop a process we started, and its process group (it was started in its own session)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
    # Children of the node (erl_child_setup, inet_gethost) share the group; reap stragglers.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _stop_node(sbin: Path, env: dict[str, str], server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [str(sbin / "rabbitmqctl"), "stop", env["RABBITMQ_PID_FILE"]],
                env=env,
                capture_output=True,
                timeout=90,
                check=False,
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
    _terminate(server)


@contextlib.contextmanager
def rabbitmq_node(
    base_dir: Path | None = None, *, start_timeout: float = 180.0, nodename: str | None = None
) -> Iterator[RabbitMQNode]:
    """Start a private RabbitMQ node with the stream plugin; stop it (and its epmd) on exit.

    ``base_dir`` (default: a fresh temporary directory, removed afterwards) holds everything the
    node writes. The node is stopped cleanly with ``rabbitmqctl stop`` so its files are complete
    when the block exits; data in a caller-given ``base_dir`` is kept.
    """
    sbin = ensure_rabbitmq_installed()
    owned_tmp = base_dir is None
    base = Path(tempfile.mkdtemp(prefix="tierlog-rmq-")) if base_dir is None else base_dir
    base.mkdir(parents=True, exist_ok=True)
    (base / "log").mkdir(exist_ok=True)
    (base / "mnesia").mkdir(exist_ok=True)
    # the same ``nodename`` and ``base_dir`` restart a node on its data
    nodename = nodename or f"tierlog-{secrets.token_hex(4)}@localhost"
    epmd_port, amqp_port, dist_port, stream_port = _free_ports(4)

    cookie = base / ".erlang.cookie"
    if not cookie.exists():
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
    (base / "rabbitmq-env.conf").write_text("")
    (base / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    (base / "rabbitmq.conf").write_text(_config_text(amqp_port, dist_port, stream_port))
    env = _node_env(base, nodename, epmd_port, dist_port)
    console_log = base / "log" / "console.log"

    epmd = _start_epmd(env, epmd_port, base / "log" / "epmd.log")
    server: subprocess.Popen[bytes] | None = None
    try:
        with console_log.open("ab") as out:
            server = subprocess.Popen(
                [str(sbin / "rabbitmq-server")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=base,
            )
        deadline = time.monotonic() + start_timeout
        while not _port_open(stream_port):
            if server.poll() is not None:
                raise RabbitMQNodeError(
                    f"rabbitmq-server exited with {server.returncode}: {_tail(console_log)}"
                )
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(
                    f"stream port {stream_port} not open after {start_timeout}s: "
                    f"{_tail(console_log)}"
                )
            time.sleep(0.25)
        yield RabbitMQNode(LOOPBACK, stream_port, base / "mnesia" / nodename, nodename)
    finally:
        try:
            if server is not None:
                _stop_node(sbin, env, server)
        finally:
            _terminate(epmd)
            if owned_tmp:
                shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    """Start a node, print where it listens, stop it: a quick check that nodes can start here."""
    started = time.monotonic()
    with rabbitmq_node() as node:
        print(
            f"nodename={node.nodename} host={node.host} stream_port={node.stream_port} "
            f"data_dir={node.data_dir} started_in={time.monotonic() - started:.1f}s",
            flush=True,
        )
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
