"""Timer objects in the remote tier and the per-stream timer manifest in the MetaStore.

A timer object holds the parked messages of one hour (``records.encode_timer_object``); it
is written once under a fresh uid and never changed:
``{prefix}/delayed/{incarnation}/{hour:010d}/{uid}.timer`` (the stream incarnation in the key:
a re-created stream never sees the old one's objects).

The timer manifest (MetaStore key ``delayed-timers/{incarnation}``) is small JSON::

    {"hours": {"<hour>": ["<uid>", ...]},      # committed objects of hours not pulled yet
     "retired": {"<hour>": ["<uid>", ...]},    # pulled; deleted once their messages are out
     "pulled_through": <hour>,                 # every hour <= this is in the working set
     "parked_through": <offset>}               # every message of the system stream below
                                               # this offset due after pulled_through is in
                                               # an object listed under "hours"

It is committed like the stream manifest pointer: a conditional put on the version read
and the writer's epoch (``MetaStore.put_if``), so a fenced (older) scheduler cannot
overwrite a newer one's manifest. The epoch is the stream's writer epoch (in a cluster: the
leader epoch under which this node leads the stream), the one the stream's manifest
committer uses. A store whose epoch is below the one recorded gets ``EpochFencedError`` on
every commit and load, also when its version is stale too (a conflict is checked against
the stored epoch): a deposed scheduler stops instead of rebuilding from the new leader's
manifest and retrying.

Encryption: timer objects follow the stream's encryption setting like every object a
stream owns (``remote.sealing.seal_object`` / ``open_object``; the one call site is here).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from urllib.parse import quote

from tierlog.delayed.errors import SystemRecordError, TimerManifestError
from tierlog.delayed.records import TimerEntry, decode_timer_object, encode_timer_object
from tierlog.remote.sealing import open_object, seal_object
from tierlog.remote.settings import StreamSettings
from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    NotFoundError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore


def manifest_key(incarnation: str) -> str:
    return f"delayed-timers/{quote(incarnation, safe='')}"


def timers_prefix(prefix: str, incarnation: str) -> str:
    base = prefix.strip("/")
    head = f"{base}/delayed" if base else "delayed"
    return f"{head}/{incarnation}/"


def timer_key(prefix: str, incarnation: str, hour: int, uid: str) -> str:
    return f"{timers_prefix(prefix, incarnation)}{hour:010d}/{uid}.timer"


@dataclass
class TimerManifest:
    hours: dict[int, list[str]] = field(default_factory=dict)
    retired: dict[int, list[str]] = field(default_factory=dict)
    pulled_through: int = -1
    parked_through: int = 0
    version: int = 0  # the MetaStore version read (0: the key does not exist)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "hours": {str(h): u for h, u in sorted(self.hours.items())},
                "retired": {str(h): u for h, u in sorted(self.retired.items())},
                "pulled_through": self.pulled_through,
                "parked_through": self.parked_through,
            }
        ).encode()

    @staticmethod
    def decode(value: bytes, version: int) -> TimerManifest:
        try:
            data = json.loads(value)
            return TimerManifest(
                hours={int(h): [str(u) for u in us] for h, us in data["hours"].items()},
                retired={int(h): [str(u) for u in us] for h, us in data["retired"].items()},
                pulled_through=int(data["pulled_through"]),
                parked_through=int(data["parked_through"]),
                version=version,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TimerManifestError(f"timer manifest (version {version}) does not decode") from exc


class TimerStore:
    """Timer objects and the timer manifest of one stream incarnation. Blocking calls:
    the scheduler runs them off the event loop."""

    def __init__(
        self,
        objects: ObjectStore,
        meta: MetaStore,
        prefix: str,
        incarnation: str,
        epoch: int,
        *,
        settings: StreamSettings | None = None,
    ) -> None:
        self.objects = objects
        self.meta = meta
        self.prefix = prefix
        self.incarnation = incarnation
        self.epoch = epoch
        self.settings = settings or StreamSettings()
        """The stream's settings: its encryption setting applies to its timer objects."""

    def key(self, hour: int, uid: str) -> str:
        return timer_key(self.prefix, self.incarnation, hour, uid)

    # ----------------------------------------------------------------- manifest

    def load_manifest(self) -> TimerManifest:
        """The committed manifest; an empty one (version 0) when there is none.
        TimerManifestError when it does not decode (the caller repairs it);
        EpochFencedError when a writer of a newer epoch committed it (this one is deposed).
        """
        stored = self.meta.get(manifest_key(self.incarnation))
        if stored is None:
            return TimerManifest()
        self._check_epoch(stored.epoch)
        return TimerManifest.decode(stored.value, stored.version)

    def _check_epoch(self, stored_epoch: int) -> None:
        if stored_epoch > self.epoch:
            raise EpochFencedError(
                f"timer manifest of {self.incarnation} has epoch {stored_epoch}"
                f" > writer epoch {self.epoch}"
            )

    def stored_version(self) -> int:
        stored = self.meta.get(manifest_key(self.incarnation))
        return 0 if stored is None else stored.version

    def commit(self, manifest: TimerManifest) -> TimerManifest:
        """Conditional put on ``manifest.version`` under this store's epoch (create when
        version 0); raises the MetaStore's VersionConflictError / AlreadyExistsError, or
        EpochFencedError when the stored manifest's epoch is above this store's (also when
        the version read is stale: the epoch decides, not the race)."""
        key = manifest_key(self.incarnation)
        try:
            if manifest.version == 0:
                stored = self.meta.create(key, manifest.encode(), epoch=self.epoch)
            else:
                stored = self.meta.put_if(key, manifest.encode(), manifest.version, self.epoch)
        except (VersionConflictError, AlreadyExistsError):
            current = self.meta.get(key)
            if current is not None:
                self._check_epoch(current.epoch)
            raise
        manifest.version = stored.version
        return manifest

    def delete_manifest(self) -> None:
        with contextlib.suppress(NotFoundError):
            self.meta.delete(manifest_key(self.incarnation))

    # ----------------------------------------------------------------- objects

    def write_object(self, hour: int, entries: list[TimerEntry]) -> str:
        """Write a new immutable object; its uid."""
        uid = os.urandom(16).hex()
        key = self.key(hour, uid)
        data = seal_object(self.settings, key, encode_timer_object(hour, entries))
        self.objects.put_if_absent(key, data)
        return uid

    def read_object(self, hour: int, uid: str) -> list[TimerEntry]:
        """The object's entries; SystemRecordError when it is damaged or of another hour,
        NotFoundError when it is gone, the sealing's FormatError / SealingKeyMissingError
        when a sealed one does not open."""
        key = self.key(hour, uid)
        data = bytes(open_object(key, self.objects.get(key)))
        stored_hour, entries = decode_timer_object(data)
        if stored_hour != hour:
            raise SystemRecordError(f"timer object {key} holds hour {stored_hour}")
        return entries

    def all_keys(self) -> list[str]:
        return [m.key for m in self.objects.list(timers_prefix(self.prefix, self.incarnation))]
