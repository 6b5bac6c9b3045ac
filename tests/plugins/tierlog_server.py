"""A real tierlog server in a subprocess, for tests (and scripts) that talk to it over TCP.

``TierlogServerProcess(data_dir, ...)`` starts ``python -m tierlog serve`` with free
loopback ports (port 0; the bound ports come back through the server's ready file), a
given data directory and optional extra TOML config; ``stop()`` sends SIGTERM (clean
shutdown) and ``restart()`` starts it again on the same data directory.

Fixtures: ``tierlog_server`` (function scope, fresh temp data dir, stopped afterwards) and
``session_tierlog_server`` (one default server for the whole session, for tests that only
need streams of their own on a server: each names its streams apart from the others').
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STARTUP_TIMEOUT_S = 30.0


class TierlogServerProcess:
    """One ``tierlog serve`` subprocess; ``host``/``stream_port``/``admin_port`` once started."""

    def __init__(
        self,
        data_dir: Path,
        *,
        config_text: str = "",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.config_text = config_text
        self.extra_env = dict(env or {})
        self.stream_port = 0
        self.admin_port = 0
        self.tls_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def start(self, wait_streams: bool = True) -> TierlogServerProcess:
        """Start and wait until it listens and, with ``wait_streams``, until start-up
        has opened every stream (they open in the background after the listeners)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ready = self.data_dir.parent / f"{self.data_dir.name}-ready.json"
        with contextlib.suppress(FileNotFoundError):
            ready.unlink()
        config = self.data_dir.parent / f"{self.data_dir.name}-server.toml"
        config.write_text(self.config_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
        env.update(
            {
                "TIERLOG_SERVER_HOST": self.host,
                "TIERLOG_SERVER_PORT": "0",
                "TIERLOG_SERVER_ADMIN_HOST": self.host,
                "TIERLOG_SERVER_ADMIN_PORT": "0",
                "TIERLOG_SERVER_READY_FILE": str(ready),
                "TIERLOG_STORAGE_DATA_DIR": str(self.data_dir),
            }
        )
        env.update(self.extra_env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierlog", "serve", "--config", str(config)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierlog serve exited early:\n{self.log_tail()}")
            if ready.exists():
                info = json.loads(ready.read_text())
                if wait_streams and not info.get("streams_opened", True):
                    time.sleep(0.05)
                    continue
                self.stream_port = int(info["stream_port"])
                self.admin_port = int(info["admin_port"])
                self.tls_port = int(info.get("tls_port", 0))
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"tierlog serve did not start in time:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait (clean shutdown); returns the exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"tierlog serve ignored SIGTERM:\n{self.log_tail()}") from None
        return int(proc.returncode)

    def kill(self) -> None:
        """SIGKILL (a crash); the data directory stays."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> TierlogServerProcess:
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except FileNotFoundError:
            return ""


@contextlib.contextmanager
def running_server(data_dir: Path, **options: Any) -> Iterator[TierlogServerProcess]:
    """A started ``TierlogServerProcess`` (options as it takes them): a clean stop on
    exit, and a kill if the clean stop failed."""
    server = TierlogServerProcess(data_dir, **options).start()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.kill()


@pytest.fixture
def tierlog_server(tmp_path: Path) -> Iterator[TierlogServerProcess]:
    """A fresh tierlog server (own data dir, free ports), stopped after the test."""
    with running_server(tmp_path / "tierlog-data") as server:
        yield server


@pytest.fixture(scope="session")
def session_tierlog_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TierlogServerProcess]:
    """One default tierlog server for the session (starting one per module costs a
    process start and a clean shutdown each)."""
    with running_server(tmp_path_factory.mktemp("session-server") / "data") as server:
        yield server


def stored_bodies(server: TierlogServerProcess, stream: str) -> list[bytes]:
    """The bodies of every message ``stream`` holds on disk, in offset order (a dump of
    its segment files, not a read through the server)."""
    import base64
    import glob

    from tierlog.log.dump import iter_dump

    (stream_dir,) = glob.glob(str(server.data_dir / "streams" / f"*_{stream}_*"))
    return [base64.b64decode(item["body"]) for item in iter_dump(stream_dir)]


class RawClient:
    """A blocking stream-protocol client on a plain socket, for robustness tests.

    Speaks just enough to get a connection open (``handshake``) and then sends any bytes
    and reads whole frames back, decoded with the codec's client-side decoder.
    """

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        import socket

        from tierlog.formats.protocol.frames import FrameSplitter

        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.splitter = FrameSplitter()
        self.frames: list[object] = []
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def recv_frame(self) -> object | None:
        """The next server frame, or None when the server closed the connection."""
        from tierlog.formats.protocol.commands import decode_server_frame

        while not self.frames:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.frames.extend(decode_server_frame(f) for f in self.splitter.feed(data))
        return self.frames.pop(0)

    def expect(self, kind: type) -> object:
        while True:
            frame = self.recv_frame()
            if frame is None:
                raise ConnectionError(f"connection closed while waiting for {kind.__name__}")
            if isinstance(frame, kind):
                return frame

    def closed_by_server(self) -> bool:
        """True when the server closes the connection (after any frames it sends first)."""
        try:
            while True:
                if self.recv_frame() is None:
                    return True
        except TimeoutError:
            return False

    def handshake(self, user: str = "guest", password: str = "guest", frame_max: int = 0) -> int:
        """PeerProperties, SASL PLAIN, Tune, Open; returns the authenticate response code."""
        from tierlog.formats.protocol import commands as c

        self.send(c.PeerPropertiesRequest(self.next_corr(), {"product": "raw"}).encode())
        self.expect(c.PeerPropertiesResponse)
        self.send(c.SaslHandshakeRequest(self.next_corr()).encode())
        self.expect(c.SaslHandshakeResponse)
        data = c.plain_data(user, password)
        self.send(c.SaslAuthenticateRequest(self.next_corr(), "PLAIN", data).encode())
        auth = self.expect(c.SaslAuthenticateResponse)
        assert isinstance(auth, c.SaslAuthenticateResponse)
        if auth.response_code != 1:
            return auth.response_code
        tune = self.expect(c.Tune)
        assert isinstance(tune, c.Tune)
        self.send(c.Tune(frame_max or tune.frame_max, tune.heartbeat).encode())
        self.send(c.OpenRequest(self.next_corr(), "/").encode())
        opened = self.expect(c.OpenResponse)
        assert isinstance(opened, c.OpenResponse)
        return opened.response_code
