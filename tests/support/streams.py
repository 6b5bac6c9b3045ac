"""Stream arguments (``x-tierlog-…``) that make a test stream tier within a second."""

from __future__ import annotations

FAST_TIERING = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.05",
    "stream-max-segment-size-bytes": "65536",
}
"""Fragments closed after a second, small segments: tiering starts almost at once."""

TIERED_AWAY = {**FAST_TIERING, "x-tierlog-local-max-bytes": "1"}
"""``FAST_TIERING`` with local retention at its minimum: tiered segments leave the disk,
so reads of them are served from the remote tier."""
