"""Configuration errors say which setting, what is allowed and what was given; near-miss
names (environment or TOML) suggest the right one; other tools' ``TIERLOG_*`` variables
and unrelated names pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.errors import ConfigError
from tierlog.server.config import load_config


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("", {"TIERLOG_SERVER_LOG_LEVEL": "verbose"}, "server.log_level must be one of debug, "),
        ("", {"TIERLOG_SERVER_LOG_FORMAT": "xml"}, "server.log_format must be one of kv, json"),
        ("", {"TIERLOG_SERVER_PORT": "fast"}, "TIERLOG_SERVER_PORT: server.port must be an"),
        ("[server]\nport = 70000\n", {}, "server.port must be 0..65535, got 70000"),
        ("[server]\nheartbeat = -1\n", {}, "server.heartbeat must be >= 0 (seconds), got -1"),
        ("[server]\nframe_max = 10\n", {}, "server.frame_max must be 1024..4294967295, got 10"),
        ("[tier]\nmax_uploads = 0\n", {}, "tier.max_uploads must be >= 1"),
        ("[server]\nuse_uvloop = 'maybe'\n", {}, "server.use_uvloop must be a boolean"),
        ("", {"TIERLOG_LOG_LEVEL": "debug"}, "did you mean TIERLOG_SERVER_LOG_LEVEL?"),
        ("", {"TIERLOG_SERVER_LOGLEVEL": "debug"}, "did you mean TIERLOG_SERVER_LOG_LEVEL?"),
        ("", {"TIERLOG_LOGLEVEL": "debug"}, "did you mean TIERLOG_SERVER_LOG_LEVEL?"),
        ("", {"TIERLOG_SEVER_PORT": "1"}, "did you mean TIERLOG_SERVER_PORT?"),
        ("", {"TIERLOG_STORAGE_DATADIR": "/x"}, "did you mean TIERLOG_STORAGE_DATA_DIR?"),
        ("[server]\nlog_levl = 'x'\n", {}, "server.log_levl; did you mean server.log_level?"),
        ("[server]\ndata_dir = 'x'\n", {}, "did you mean storage.data_dir?"),
        ("[tier]\nmax_upload = 2\n", {}, "did you mean tier.max_uploads?"),
        ("[sever]\nport = 1\n", {}, "unknown config section [sever]; did you mean [server]?"),
        ("server = 1\n", {}, "[server] must be a table of settings"),
    ],
)
def test_message_names_setting_and_allowed_values(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ=env)
    assert message in str(info.value)


def test_unknown_names_without_a_near_miss_are_plain() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"TIERLOG_SERVER_ZZZZZZ": "1"})
    assert str(info.value) == "unknown setting TIERLOG_SERVER_ZZZZZZ"


def test_other_tierlog_variables_pass() -> None:
    env = {"TIERLOG_S3_BUCKET": "b", "TIERLOG_S3_ENDPOINT": "http://x", "TIERLOG_HOME": "/x"}
    config = load_config(None, environ=env)
    assert config.server.log_level == "INFO"


def test_log_level_any_case() -> None:
    assert load_config(None, environ={"TIERLOG_SERVER_LOG_LEVEL": "debug"}).server.log_level
    assert load_config(None, environ={"TIERLOG_SERVER_LOG_LEVEL": "WARNING"}).server.log_level
