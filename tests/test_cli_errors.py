"""The usual mistakes of a new operator, run as ``python -m tierlog ...`` subprocesses:
each ends in exactly one line on stderr naming what to fix, and the exit code
docs/server.md documents for it, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tierlog
from tierlog.cli import (
    EXIT_CONFIG,
    EXIT_LISTEN,
    EXIT_MISSING_EXTRA,
    EXIT_STORE,
)

SRC = str(Path(tierlog.__file__).resolve().parent.parent)


def run(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    pythonpath: str = "",
    config: str | None = None,
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TIERLOG_", "AWS_"))}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, SRC) if p)
    environ["TIERLOG_STORAGE_DATA_DIR"] = str(tmp_path / "data")
    if config is None:  # (the environment wins over the file)
        environ.update({"TIERLOG_SERVER_PORT": "0", "TIERLOG_SERVER_ADMIN_PORT": "0"})
    environ.update(env or {})
    argv = [sys.executable, "-m", "tierlog", *args]
    if config is not None:
        path = tmp_path / "tierlog.toml"
        path.write_text(config)
        argv += ["--config", str(path)]
    return subprocess.run(
        argv, env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *parts: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    # besides structured log lines (retries of a store that is down), one error line
    lines = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: "), line
    for part in parts:
        assert part in line, line
    assert result.returncode == code, (result.returncode, line)
    return line


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_version(tmp_path: Path) -> None:
    result = run(tmp_path, "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"tierlog {tierlog.__version__}"


@pytest.mark.parametrize("setting", ["server.port", "server.admin_port"])
def test_port_in_use(tmp_path: Path, busy_port: int, setting: str) -> None:
    env_name = "TIERLOG_" + setting.replace(".", "_").upper()
    result = run(tmp_path, "serve", env={env_name: str(busy_port)})
    one_line_error(
        result, EXIT_LISTEN, f"127.0.0.1:{busy_port}", setting, env_name, "already in use"
    )


@pytest.mark.parametrize(
    ("module", "env", "extra"),
    [
        ("aetcd", {"TIERLOG_STORAGE_META_STORE": "etcd://127.0.0.1:2379/tierlog"}, "etcd"),
        ("aiohttp", {}, "server"),
    ],
)
def test_missing_extra(tmp_path: Path, module: str, env: dict[str, str], extra: str) -> None:
    fake = tmp_path / "fake-site" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    result = run(tmp_path, "serve", env=env, pythonpath=str(fake.parent))
    one_line_error(result, EXIT_MISSING_EXTRA, f"'{module}'", f"pip install 'tierlog[{extra}]'")


@pytest.mark.parametrize(
    ("env", "config", "parts"),
    [
        (
            {"TIERLOG_SERVER_LOG_LEVEL": "verbose"},
            None,
            ["server.log_level", "debug, info, warning, error, critical", "'verbose'"],
        ),
        ({}, "[server]\nport = 70000\n", ["server.port must be 0..65535", "70000"]),
        (
            {"TIERLOG_LOG_LEVEL": "debug"},
            None,
            ["unknown setting TIERLOG_LOG_LEVEL", "did you mean TIERLOG_SERVER_LOG_LEVEL?"],
        ),
        (
            {},
            "[server]\nlog_levl = 'debug'\n",
            ["unknown setting server.log_levl", "did you mean server.log_level?"],
        ),
    ],
)
def test_bad_config(
    tmp_path: Path, env: dict[str, str], config: str | None, parts: list[str]
) -> None:
    result = run(tmp_path, "serve", env=env, config=config)
    one_line_error(result, EXIT_CONFIG, *parts)
    # (more values and near misses: tests/test_server_config.py, in-process)


def test_unreachable_meta_store_redacts_credentials(tmp_path: Path) -> None:
    port = closed_port()
    uri = f"etcd://root:s3cret@127.0.0.1:{port}/tierlog"
    result = run(
        tmp_path,
        "serve",
        env={"TIERLOG_STORAGE_META_STORE": uri, "TIERLOG_STORE_STARTUP_DEADLINE_SECONDS": "1"},
    )
    line = one_line_error(
        result,
        EXIT_STORE,
        f"cannot open the MetaStore etcd://root:***@127.0.0.1:{port}/tierlog",
        "storage.meta_store",
        "still unusable after 1 s of retries",  # connection refused is retried first
    )
    assert "s3cret" not in line


def test_unreachable_object_store(tmp_path: Path) -> None:
    port = closed_port()
    uri = f"s3://bucket?endpoint=http://127.0.0.1:{port}"
    result = run(
        tmp_path,
        "serve",
        env={
            "TIERLOG_STORAGE_OBJECT_STORE": uri,
            "AWS_ACCESS_KEY_ID": "key",
            "AWS_SECRET_ACCESS_KEY": "secret-key",
            "TIERLOG_STORE_STARTUP_DEADLINE_SECONDS": "1",
        },
    )
    line = one_line_error(
        result,
        EXIT_STORE,
        f"cannot open the object store {uri}",
        "storage.object_store",
        "still unusable after 1 s of retries",
    )
    assert "secret-key" not in line


def test_data_dir_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(tmp_path, "serve", env={"TIERLOG_STORAGE_DATA_DIR": str(blocker / "data")})
    one_line_error(result, EXIT_STORE, str(blocker / "data"), "storage.data_dir")


def test_bad_sqlite_meta_store_names_the_setting(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path}/missing/meta.db"
    result = run(tmp_path, "serve", env={"TIERLOG_STORAGE_META_STORE": uri})
    one_line_error(result, EXIT_CONFIG, "storage.meta_store", "does not exist")
