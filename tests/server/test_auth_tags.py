"""The ``administrator`` tag (``auth.tags``): parsed from TOML and the environment, only
known tags, only known users, ``guest`` by default, and what ``is_administrator`` says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.errors import ConfigError
from tierlog.server.auth import Authenticator, parse_tags
from tierlog.server.config import load_config


def test_tags_from_toml_and_environment() -> None:
    assert parse_tags({"alice": ["administrator"], "bob": "administrator"}) == {
        "alice": ("administrator",),
        "bob": ("administrator",),
    }
    assert parse_tags("alice:administrator, bob:administrator") == {
        "alice": ("administrator",),
        "bob": ("administrator",),
    }
    assert parse_tags({}) == {}


@pytest.mark.parametrize(
    "value",
    [
        {"alice": ["management"]},  # a RabbitMQ tag tierlog does not act on: refused
        {"alice": [1]},
        {"alice": {"administrator": True}},
        "alice",
        "alice:monitoring",
        ["alice"],
    ],
)
def test_bad_tags_are_refused(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_tags(value)


def test_config_tags_name_known_users_and_default_to_guest(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[auth]\nusers = { guest = "g", ops = "o" }\ntags = { ops = ["administrator"] }\n'
    )
    config = load_config(str(path), environ={})
    assert config.auth.tags == {"ops": ("administrator",)}
    path.write_text('[auth]\nusers = { ops = "o" }\ntags = { nobody = ["administrator"] }\n')
    with pytest.raises(ConfigError, match="unknown user"):
        load_config(str(path), environ={})
    config = load_config(None, environ={"TIERLOG_AUTH_TAGS": "guest:administrator"})
    assert config.auth.tags == {"guest": ("administrator",)}
    with pytest.raises(ConfigError, match="unknown tag"):
        load_config(None, environ={"TIERLOG_AUTH_TAGS": "guest:policymaker"})


def test_who_is_an_administrator() -> None:
    default = Authenticator({"guest": "g", "app": "a"})
    assert default.is_administrator("guest") and not default.is_administrator("app")
    assert not Authenticator({"app": "a"}).is_administrator("guest")  # not a user
    tagged = Authenticator({"guest": "g", "ops": "o"}, tags={"ops": ("administrator",)})
    assert tagged.is_administrator("ops") and not tagged.is_administrator("guest")
    none = Authenticator({"guest": "g"}, tags={})
    assert not none.is_administrator("guest")
