"""The tiering state machine's configuration from a stream's settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tierlog.remote.settings import StreamSettings
from tierlog.tiering.state import TieringConfig


def tiering_config(settings: StreamSettings, **overrides: Any) -> TieringConfig:
    """What the stream's settings ask of the tiering state machine (``overrides`` win)."""
    base = TieringConfig(
        fragment_bytes=settings.fragment_bytes,
        max_fragment_age=settings.max_fragment_age_seconds,
        debounce_count=settings.debounce_count,
        debounce_seconds=settings.debounce_seconds,
    )
    return replace(base, **overrides) if overrides else base
