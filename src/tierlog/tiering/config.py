"""The tiering state machine's configuration from a stream's settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tierlog.remote.settings import StreamSettings
from tierlog.tiering.state import DEBOUNCE_BYTES, TieringConfig


def tiering_config(settings: StreamSettings, **overrides: Any) -> TieringConfig:
    """What the stream's settings ask of the tiering state machine (``overrides`` win).
    A commit batch holds at most half of ``max_lag_bytes``: uploaded fragments waiting
    for their batch count as lag, and a batch that could not fill below the limit would
    hold publishers back until the debounce timer fires."""
    base = TieringConfig(
        fragment_bytes=settings.fragment_bytes,
        max_fragment_age=settings.max_fragment_age_seconds,
        debounce_count=settings.debounce_count,
        debounce_seconds=settings.debounce_seconds,
        debounce_bytes=max(1, min(DEBOUNCE_BYTES, settings.max_lag_bytes // 2)),
    )
    return replace(base, **overrides) if overrides else base
