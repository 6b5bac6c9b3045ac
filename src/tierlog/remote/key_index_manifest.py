"""A stream's key-index manifest in the object store, committed like the stream manifest.

Objects ``{prefix}/stream/{dir}/kindex/manifest.{uid}.kim`` (create-only, a fresh uid per
commit, sealed when the stream is encrypted) named by the MetaStore pointer
``kindex-pointer/{incarnation}`` = ``{"uid": hex, "epoch": n}``. A commit writes the new
object, then puts the pointer conditionally (version unchanged, stored epoch <= the writer's
epoch): a concurrent writer of the same epoch makes it reload and re-apply its change (changes
are functions of the current windows, so a retry is idempotent); a writer of a higher epoch
fences it (``KeyIndexFencedError``). An ambiguous pointer put is settled by re-reading the
pointer. Objects that are no longer named (the superseded manifest, window files dropped by
retention) go through the caller's grace-period deletion queue, never at once.
"""

from __future__ import annotations

import contextlib
import json
import uuid as uuid_module
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from tierlog.errors import TierlogError
from tierlog.formats.errors import FormatError
from tierlog.formats.key_index_manifest import (
    KeyIndexManifest,
    WindowEntry,
    decode_manifest,
    encode_manifest,
)
from tierlog.remote.catalog import pointer_key as stream_pointer_key
from tierlog.remote.errors import (
    KeyIndexFencedError,
    KeyIndexManifestError,
    StreamDeletedError,
)
from tierlog.remote.key_index_files import index_prefix, window_file_key
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

COMMIT_ATTEMPTS = 8

Change = Callable[[tuple[WindowEntry, ...]], Sequence[WindowEntry]]
Schedule = Callable[[Iterable[str]], None]


def pointer_key(incarnation: str) -> str:
    return f"kindex-pointer/{quote(incarnation, safe='')}"


def manifest_key(prefix: str, stream_dir: str, uid: str) -> str:
    return f"{index_prefix(prefix, stream_dir)}manifest.{uid}.kim"


@dataclass(frozen=True, slots=True)
class CommittedIndex:
    """The committed key-index manifest and the pointer version it was read at."""

    manifest: KeyIndexManifest
    uid: str | None
    version: int  # 0: no pointer yet


class KeyIndexManifestStore:
    """Reads and commits one stream's key-index manifest."""

    def __init__(
        self,
        meta: MetaStore,
        store: ObjectStore,
        prefix: str,
        stream_dir: str,
        *,
        epoch: int = 1,
        settings: Callable[[], StreamSettings] = StreamSettings,
    ) -> None:
        self.meta = meta
        self.store = store
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.epoch = epoch
        self._settings = settings
        self.commits = 0
        self.conflicts = 0

    def read(self) -> CommittedIndex:
        """The committed manifest (empty before the first commit). KeyIndexManifestError
        when the pointer or the object it names is damaged or gone."""
        for _ in range(COMMIT_ATTEMPTS):
            stored = self.meta.get(pointer_key(self.stream_dir))
            if stored is None:
                return CommittedIndex(KeyIndexManifest(self.stream_dir, 0), None, 0)
            try:
                data = json.loads(stored.value)
                uid = str(data["uid"])
                uuid_module.UUID(hex=uid)
            except (ValueError, KeyError, TypeError) as exc:
                raise KeyIndexManifestError(
                    f"{self.stream_dir}: key-index pointer: {exc}"
                ) from None
            key = manifest_key(self.prefix, self.stream_dir, uid)
            try:
                body = self.store.get(key)
            except NotFoundError:
                continue  # superseded and deleted after its grace: the pointer moved on
            try:
                manifest = decode_manifest(open_object(key, body))
            except FormatError as exc:
                raise KeyIndexManifestError(f"{key}: {exc}") from exc
            if manifest.stream_dir != self.stream_dir:
                raise KeyIndexManifestError(f"{key}: names stream {manifest.stream_dir!r}")
            return CommittedIndex(manifest, uid, stored.version)
        raise KeyIndexManifestError(f"{self.stream_dir}: key-index manifest keeps disappearing")

    def commit(self, change: Change, schedule: Schedule) -> CommittedIndex:
        """Apply ``change`` to the committed windows and commit the result (nothing when it
        changes nothing). Window files the change drops and the superseded manifest object
        are handed to ``schedule`` (the grace-period deletion queue) after the commit."""
        for _ in range(COMMIT_ATTEMPTS):
            current = self.read()
            windows = tuple(sorted(change(current.manifest.windows), key=lambda w: w.start))
            if windows == current.manifest.windows and current.uid is not None:
                return current
            epoch = max(self.epoch, current.manifest.epoch)
            if current.manifest.epoch > self.epoch:
                raise KeyIndexFencedError(
                    f"{self.stream_dir}: key-index manifest epoch {current.manifest.epoch} "
                    f"> ours {self.epoch}"
                )
            uid = uuid_module.uuid4().hex
            key = manifest_key(self.prefix, self.stream_dir, uid)
            manifest = KeyIndexManifest(self.stream_dir, epoch, windows)
            self.store.put_if_absent(
                key, seal_object(self._settings(), key, encode_manifest(manifest))
            )
            value = json.dumps({"uid": uid, "epoch": epoch}).encode()
            if current.version == 0 and self.meta.get(stream_pointer_key(self.stream_dir)) is None:
                self._discard(key)  # the stream was deleted: never re-create its pointer
                raise StreamDeletedError(f"stream {self.stream_dir} was deleted")
            try:
                if current.version == 0:
                    version = self.meta.create(pointer_key(self.stream_dir), value, epoch).version
                else:
                    version = self.meta.put_if(
                        pointer_key(self.stream_dir), value, current.version, epoch
                    ).version
            except (VersionConflictError, AlreadyExistsError):
                self.conflicts += 1
                self._discard(key)
                continue  # another writer committed: re-apply the change to its windows
            except EpochFencedError as exc:
                self._discard(key)
                raise KeyIndexFencedError(f"{self.stream_dir}: {exc}") from exc
            except TierlogError:
                if self._pointer_names(uid):
                    version = self.read().version
                else:
                    self._discard(key)
                    raise
            self.commits += 1
            kept = {w.start for w in windows}
            retired = [
                window_file_key(self.prefix, self.stream_dir, w)
                for w in current.manifest.windows
                if w.start not in kept
            ]
            if current.uid is not None:
                retired.append(manifest_key(self.prefix, self.stream_dir, current.uid))
            schedule(retired)
            return CommittedIndex(manifest, uid, version)
        raise KeyIndexManifestError(f"{self.stream_dir}: key-index commit lost every race")

    def _pointer_names(self, uid: str) -> bool:
        with contextlib.suppress(TierlogError):
            stored = self.meta.get(pointer_key(self.stream_dir))
            return stored is not None and json.loads(stored.value).get("uid") == uid
        return False

    def _discard(self, key: str) -> None:
        with contextlib.suppress(TierlogError):
            self.store.delete(key)


def add_windows(new: Sequence[WindowEntry]) -> Change:
    """A change adding ``new`` windows (a window already listed keeps its entry)."""

    def change(windows: tuple[WindowEntry, ...]) -> list[WindowEntry]:
        have = {w.start for w in windows}
        return [*windows, *(w for w in new if w.start not in have)]

    return change


def drop_expired(first_offset: int) -> Change:
    """A change dropping every window whose records are all past retention: the stream's
    first offset has reached the window's ``next_offset``."""

    def change(windows: tuple[WindowEntry, ...]) -> list[WindowEntry]:
        return [w for w in windows if w.next_offset > first_offset]

    return change
