"""Which nodes are being retired, in the MetaStore: ``cluster/retiring/{node}`` (JSON).

Any node writes the record when asked to retire a node (the admin API of any node, so
a node that is down can be retired too); it outlives restarts of the retiring node,
unlike the node record, which the node rewrites at each registration. A retiring node
never leads a stream and is never chosen as a new member; leaders move their streams
off it (``member_plan``); once it is a member of nothing it releases its node lease
and marks the record ``retired``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

from tierlog.cluster.errors import ClusterError
from tierlog.storage.errors import (
    AlreadyExistsError,
    KeyDeletedError,
    NotFoundError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore, validate_meta_key

RETIRING_PREFIX = "cluster/retiring/"


def retiring_key(node: str) -> str:
    return RETIRING_PREFIX + quote(node, safe="")


@dataclass(frozen=True, slots=True)
class Retirement:
    """A retirement request: since when, and whether the node has finished (holds no
    stream member, lease released)."""

    node: str
    requested_ms: int
    retired_ms: int | None = None

    @property
    def retired(self) -> bool:
        return self.retired_ms is not None

    def encode(self) -> bytes:
        return json.dumps(
            {"node": self.node, "requested_ms": self.requested_ms, "retired_ms": self.retired_ms}
        ).encode()

    @staticmethod
    def decode(value: bytes) -> Retirement:
        try:
            data = json.loads(value)
            retired = data.get("retired_ms")
            return Retirement(
                str(data["node"]),
                int(data["requested_ms"]),
                None if retired is None else int(retired),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ClusterError(f"retirement record does not decode: {exc}") from exc


class Retirements:
    """The retirement records of one cluster (blocking MetaStore calls)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def request(self, node: str) -> Retirement:
        """Mark ``node`` retiring (idempotent: an existing request is returned as is)."""
        validate_meta_key(node)
        record = Retirement(node, int(time.time() * 1000))
        try:
            self.meta.create(retiring_key(node), record.encode())
        except AlreadyExistsError:
            existing = self.get(node)
            if existing is not None:
                return existing
            return self.request(node)  # deleted meanwhile: ask again
        return record

    def get(self, node: str) -> Retirement | None:
        stored = self.meta.get(retiring_key(node))
        return None if stored is None else Retirement.decode(stored.value)

    def all(self) -> dict[str, Retirement]:
        out = {}
        for stored in self.meta.list(RETIRING_PREFIX):
            record = Retirement.decode(stored.value)
            out[unquote(stored.key[len(RETIRING_PREFIX) :])] = record
        return out

    def mark_retired(self, node: str) -> Retirement | None:
        """Record that ``node`` finished; None if its request was withdrawn."""
        while True:
            stored = self.meta.get(retiring_key(node))
            if stored is None:
                return None
            current = Retirement.decode(stored.value)
            if current.retired:
                return current
            done = Retirement(current.node, current.requested_ms, int(time.time() * 1000))
            try:
                self.meta.put_if(retiring_key(node), done.encode(), stored.version, stored.epoch)
                return done
            except (VersionConflictError, KeyDeletedError):
                continue

    def withdraw(self, node: str) -> bool:
        """Cancel a retirement (the node leads and is chosen again); False if none."""
        try:
            self.meta.delete(retiring_key(node))
        except NotFoundError:
            return False
        return True
