"""A publisher declared on a connection."""

from __future__ import annotations

from dataclasses import dataclass

from tierlog.server.broker import StreamHandle


@dataclass(slots=True)
class Publisher:
    id: int
    stream: StreamHandle
    reference: str | None
