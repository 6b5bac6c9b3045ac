"""Server config (TOML + TIERLOG_* overrides) and stream-argument parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.errors import ConfigError
from tierlog.server.arguments import parse_duration, settings_changes, settings_from_arguments
from tierlog.server.config import load_config


def test_zero_config_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, environ={})
    storage = config.storage.resolved()
    assert storage.data_dir == str(tmp_path / "tierlog-data")
    assert storage.object_store == f"file://{tmp_path}/tierlog-data/objects"
    assert storage.meta_store == f"sqlite://{tmp_path}/tierlog-data/meta.db"
    assert config.server.port == 5552
    assert dict(config.auth.users) == {"guest": "guest"}
    assert config.auth.loopback_users == ("guest",)


def test_toml_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[server]\nport = 6000\nheartbeat = 10\nlog_format = "json"\n'
        '[storage]\ndata_dir = "/srv/t"\n'
        '[auth]\nusers = { alice = "pw" }\nloopback_users = []\n'
        "[log]\ngroup_commit_max_frames = 8\n"
    )
    env = {"TIERLOG_SERVER_PORT": "7000", "TIERLOG_USERS": "bob:x,carol:y", "OTHER": "1"}
    config = load_config(str(path), environ=env)
    assert config.server.port == 7000
    assert config.server.heartbeat == 10
    assert config.server.log_format == "json"
    assert config.storage.data_dir == "/srv/t"
    assert dict(config.auth.users) == {"bob": "x", "carol": "y"}
    assert config.auth.loopback_users == ()
    assert config.log.group_commit_max_frames == 8
    env = {"TIERLOG_SERVER_USE_UVLOOP": "false"}
    assert load_config(None, environ=env).server.use_uvloop is False


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("[server]\nport = 70000\n", {}),
        ("[server]\nnope = 1\n", {}),
        ("[nosuch]\nx = 1\n", {}),
        ("[server]\nport = 'abc'\n", {}),
        ("not toml = = =", {}),
        ("", {"TIERLOG_SERVER_PORT": "x"}),
        ("", {"TIERLOG_SERVER_NOPE": "1"}),
        ("", {"TIERLOG_USERS": "nopassword"}),
        ("[server]\nlog_format = 'xml'\n", {}),
        ("[log]\nmax_chunk_bytes = 10\n", {}),
    ],
)
def test_bad_config_rejected(tmp_path: Path, text: str, env: dict[str, str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(str(path), environ=env)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_config(str(tmp_path / "absent.toml"), environ={})


def test_durations() -> None:
    assert parse_duration("7D") == 7 * 86400
    assert parse_duration("12h") == 43200
    assert parse_duration("30m") == 1800
    assert parse_duration("10s") == 10
    assert parse_duration("10") == 10
    assert parse_duration("1Y") == 365 * 86400
    for bad in ("", "h", "-1s", "0s", "1w", "1.2.3s"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_stream_arguments() -> None:
    changes = settings_changes(
        {
            "max-length-bytes": "1000",
            "x-max-age": "1h",
            "x-tierlog-local-max-age": "10m",
            "x-tierlog-read-strategy": "FORCE",
            "queue-leader-locator": "client-local",
        }
    )
    assert changes == {
        "max_bytes": 1000,
        "max_age_seconds": 3600,
        "local_max_age_seconds": 600,
        "read_strategy": "FORCE",
    }
    with pytest.raises(ConfigError):
        settings_changes({"x-tierlog-bogus": "1"})
    for locator in ("balanced", "least-leaders", "random"):  # never accepted and ignored
        with pytest.raises(ConfigError, match="client-local"):
            settings_changes({"x-queue-leader-locator": locator})
    with pytest.raises(ConfigError):
        settings_changes({"max-length-bytes": "lots"})
    with pytest.raises(ConfigError):
        settings_from_arguments({"x-tierlog-fragment-bytes": "10"})  # below 1 MiB
    with pytest.raises(ConfigError):
        settings_from_arguments({"max-length-bytes": "-5"})


def test_local_limits_are_refused_on_segment_streams() -> None:
    """A segment-offload stream frees offloaded segments after its deletion lag; a local
    limit on it would be accepted and do nothing."""
    for extra in ({"x-tierlog-local-max-bytes": "1"}, {"x-tierlog-local-max-age": "1h"}):
        with pytest.raises(ConfigError, match="tier_mode 'fragments' only"):
            settings_from_arguments({"x-tierlog-tier-mode": "segments", **extra})
        assert settings_from_arguments(extra).tier_mode == "fragments"
