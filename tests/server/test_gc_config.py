"""``tier.gc_*`` settings: on by default, invalid values and settings that would do nothing
are a ``ConfigError`` at load time (never accepted and ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.errors import ConfigError
from tierlog.server.config import load_config


def test_gc_is_on_by_default_with_a_day_of_grace() -> None:
    tier = load_config(None, environ={}).tier
    assert tier.gc_enabled is True
    assert tier.gc_grace_seconds == 86400.0 and tier.gc_interval_seconds == 3600.0


def test_short_gc_settings_are_accepted_above_the_stall_bound(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[store]\ntask_stall_seconds = 1.5\n"
        "[tier]\ngc_interval_seconds = 1\ngc_grace_seconds = 4\ngc_deletes_per_second = 0\n"
    )
    tier = load_config(str(path), environ={}).tier
    assert (tier.gc_interval_seconds, tier.gc_grace_seconds) == (1.0, 4.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tier]\ngc_interval_seconds = 0\n", "gc_interval_seconds must be > 0"),
        ("[tier]\ngc_grace_seconds = -1\n", "gc_grace_seconds must be > 0"),
        ("[tier]\ngc_deletes_per_second = -5\n", "gc_deletes_per_second must be >= 0"),
        ("[tier]\ngc_grace_seconds = 'soon'\n", "gc_grace_seconds"),
        # shorter than an upload and its commit may take (2 x task_stall_seconds = 600)
        ("[tier]\ngc_grace_seconds = 600\n", "2 x store.task_stall_seconds"),
        # settings that would do nothing
        ("[tier]\ngc_enabled = false\ngc_interval_seconds = 60\n", "gc_enabled = false"),
        ("[tier]\nenabled = false\ngc_grace_seconds = 7200\n", "tier.enabled = false"),
        ("[reader]\nread_only = true\n[tier]\ngc_enabled = false\n", "read_only = true"),
    ],
)
def test_invalid_or_useless_gc_settings_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(str(path), environ={})


def test_gc_settings_from_the_environment_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="gc_interval_seconds"):
        load_config(None, environ={"TIERLOG_TIER_GC_INTERVAL_SECONDS": "-1"})
