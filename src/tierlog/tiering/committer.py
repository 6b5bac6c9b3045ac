"""The manifest commit protocol with optimistic concurrency.

Order of a commit: new branch objects (create-only, fresh uids) → new root under a
fresh uid (create-only) → conditional put of the pointer (version unchanged, stored
epoch <= ours). Data is durable in the remote tier only after the conditional put.
After a failed or ambiguous conditional put the pointer is re-read before anything
is deleted: if it names our new root, the commit happened.

A sealed pointer (the stream created encrypted and still so) promises readers that every
object the manifest names is sealed; they refuse a plaintext one. The promise is checked
where it is made: a commit whose new entries include an object that is not sealed (one
uploaded while encryption was off, also when it was turned on again before this commit)
drops the flag for good, as a commit while encryption is off does, so no setting change
can leave committed data that readers refuse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from tierlog.formats.fragment_v2 import FragmentIndexV2
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.committed import read_committed_root
from tierlog.remote.errors import CorruptFragmentError, SealingKeyMissingError, StreamDeletedError
from tierlog.remote.fragments import FragmentEntry, RemoteStream
from tierlog.remote.keys import new_uid
from tierlog.remote.manifest_tree import DEFAULT_M, ManifestTree
from tierlog.remote.sealing import seal_object
from tierlog.remote.segments import read_segment_index
from tierlog.remote.settings import StreamSettings
from tierlog.storage.errors import (
    EpochFencedError,
    KeyDeletedError,
    StorageError,
    TransientError,
)
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.errors import CommitRetryError, DeposedError, EncryptionKeyMissingError

log = get_logger(__name__)


def _ignore(seconds: float) -> None:
    pass


def _unfenced() -> None:
    pass


class ManifestCommitter:
    """Holds the committed manifest (cached root) and commits new entries to it."""

    def __init__(
        self,
        remote: RemoteStream,
        catalog: Catalog,
        deletions: DeletionQueue,
        epoch: int,
        m: int = DEFAULT_M,
        settings: Callable[[], StreamSettings] | None = None,
    ) -> None:
        self.remote = remote
        # an encrypted stream's roots and branches are sealed like all its objects
        self._settings = settings
        self.catalog = catalog
        self.deletions = deletions
        self.epoch = epoch
        self.m = m
        self.pointer = ManifestPointer(root_uid=None, epoch=0, version=0)
        self.tree = self._empty_tree()
        self.commits = 0
        self.on_commit_seconds: Callable[[float], None] = _ignore
        """Told each commit attempt's duration (the server points it at a histogram)."""
        self.conflicts = 0
        self.puts = 0
        self.fence: Callable[[], None] = _unfenced
        """Called right before each conditional put of the pointer; raises
        ``DeposedError`` when this writer may no longer commit (a cluster leader past
        its lease deadline), so a paused and woken leader commits nothing."""
        self._lock = threading.RLock()
        self._upload_sealing: dict[str, bool] = {}
        self.seal_drops = 0

    def note_upload(self, key: str, sealed: bool) -> None:
        """An object this writer uploaded, and whether it sealed it (the settings snapshot
        it was coded with): its commit then needs no read to know. Thread-safe (a dict
        store; uploads run on a pool)."""
        self._upload_sealing[key] = sealed

    def _entry_sealed(self, entry: FragmentEntry) -> bool:
        """Whether the object(s) of a new entry are sealed: as noted at upload, else read
        (an object adopted from an earlier attempt, an offloaded segment's index)."""
        known = self._upload_sealing.get(entry.key)
        if known is not None:
            return known
        if entry.is_segment:
            try:
                read_segment_index(self.remote.store, entry, require_sealed=True)
            except CorruptFragmentError:
                return False
            return True
        fragment = self.remote.read_fragment(entry.first_offset)
        return (
            fragment is not None
            and isinstance(fragment.index, FragmentIndexV2)
            and fragment.index.encrypted
        )

    def _empty_tree(self) -> ManifestTree:
        return ManifestTree(self.remote.prefix, self.remote.stream_dir, m=self.m, epoch=self.epoch)

    @property
    def incarnation(self) -> str:
        return self.remote.stream_dir

    def load(self) -> ManifestTree:
        """Read the pointer and the root it names (re-reading the pointer on a 404)."""
        pointer, data = read_committed_root(
            self.catalog, self.remote.store, self.remote.prefix, self.incarnation
        )
        if pointer is None:
            raise StreamDeletedError(f"stream {self.incarnation} was deleted")
        self.pointer = pointer
        if data is None:
            self.tree = self._empty_tree()
        else:
            self.tree = ManifestTree.from_root(
                data, self.remote.prefix, m=self.m, sealed=pointer.sealed
            )
        return self.tree

    def commit(self, entries: Sequence[FragmentEntry], trim_to: int | None = None) -> ManifestTree:
        """Append ``entries`` (may be empty: a fencing commit) and commit the new root.

        With ``trim_to`` (remote retention) whole fragments ending at or before it are
        removed in the same commit; they and superseded branches go on the
        pending-deletion list once the commit took effect. Commits are serialised."""
        with self._lock:
            started = time.perf_counter()
            try:
                return self._commit(entries, trim_to)
            finally:
                self.on_commit_seconds(time.perf_counter() - started)

    def _commit(self, entries: Sequence[FragmentEntry], trim_to: int | None) -> ManifestTree:
        if self.tree.is_empty and entries:
            attempt = ManifestTree(
                self.remote.prefix,
                self.remote.stream_dir,
                m=self.m,
                epoch=self.epoch,
                next_offset=self.tree.next_offset,
            )
        else:
            attempt = ManifestTree.from_root(
                self.tree.encode_root(), self.remote.prefix, m=self.m, sealed=self.tree.sealed
            )
        written: list[str] = []
        store = self.remote.store
        retired: list[str] = []
        try:
            branches = attempt.append(list(entries))
            if trim_to is not None:
                trimmed = attempt.trim_front(trim_to, self.remote.load)
                branches = [*branches, *trimmed.writes]
                retired = trimmed.deletes
            for branch in branches:
                store.put_if_absent(branch.key, self._sealed(branch.key, branch.data))
                written.append(branch.key)
                self.puts += 1
            uid = new_uid()
            sealed = self._seals_everything()
            if sealed:
                plaintext = [e.key for e in entries if not self._entry_sealed(e)]
                if plaintext:
                    sealed = False
                    self.seal_drops += 1
                    log.warning(
                        "manifest_seal_dropped",
                        stream=self.incarnation,
                        plaintext=plaintext[0],
                        objects=len(plaintext),
                        reason="uploaded while encryption was off",
                    )
            root_key = self.remote.root_key(uid)
            store.put_if_absent(root_key, self._sealed(root_key, attempt.encode_root(self.epoch)))
            written.append(root_key)
            self.puts += 1
        except SealingKeyMissingError as exc:  # not worth a retry: nothing goes out unsealed
            self._discard(written)
            raise EncryptionKeyMissingError(str(exc)) from exc
        except Exception as exc:  # typed or not (a raw OS error): unpublished, retry
            self._discard(written)
            raise CommitRetryError(f"writing manifest objects failed: {exc!r}") from exc
        try:
            self.fence()
        except DeposedError:
            self._discard(written)
            raise
        try:
            version = self.catalog.put_pointer(
                self.incarnation, uid.hex(), self.epoch, self.pointer.version, sealed=sealed
            )
        except KeyDeletedError as exc:
            self._discard(written)
            raise StreamDeletedError(f"stream {self.incarnation} was deleted") from exc
        except EpochFencedError as exc:
            self._discard(written)
            raise DeposedError(f"{self.incarnation}: {exc}") from exc
        except Exception as exc:
            # Version conflict or an ambiguous outcome (any error, typed or not, may hide a
            # put that took effect): the pointer decides.
            version = self._resolve_ambiguous(uid, written, exc, sealed)
        old = self.pointer.root_uid
        self.pointer = ManifestPointer(uid.hex(), self.epoch, version, sealed)
        attempt.epoch = self.epoch
        attempt.sealed = sealed
        self.tree = attempt
        self.commits += 1
        if old is not None:
            retired.append(self.remote.root_key(bytes.fromhex(old)))
        self.deletions.schedule(retired)
        for entry in entries:
            self._upload_sealing.pop(entry.key, None)
        return attempt

    def _sealed(self, key: str, data: bytes) -> bytes:
        if self._settings is None:
            return data
        return seal_object(self._settings(), key, data)

    def _seals_everything(self) -> bool:
        """Whether the pointer of this commit says the manifest is sealed: the stream was
        created encrypted (its first pointer says so) and still is (a stream that turned
        encryption on later still names plaintext branches and segments of before)."""
        if self._settings is None or self._settings().encryption == "none":
            return False
        return self.pointer.sealed

    def _resolve_ambiguous(
        self, uid: bytes, written: list[str], exc: Exception, sealed: bool
    ) -> int:
        pointer = None
        for _ in range(5):
            try:
                pointer = self.catalog.read_pointer(self.incarnation)
                break
            except TransientError:
                continue
        else:
            raise CommitRetryError(f"pointer unreadable after {exc}") from exc
        if pointer is not None and pointer.root_uid == uid.hex():
            return pointer.version  # the conditional put took effect after all
        if pointer is not None and pointer.version == self.pointer.version:
            # Unchanged: the ambiguous put may still apply later (etcd), so its root must
            # not go. Retry the identical put: it applies now, or the pointer moves on.
            version = self._retry_identical_put(uid, sealed)
            if version is not None:
                return version
            pointer = self.catalog.read_pointer(self.incarnation)
            if pointer is not None and pointer.root_uid == uid.hex():
                return pointer.version
            if pointer is not None and pointer.version == self.pointer.version:
                self.conflicts += 1
                raise CommitRetryError(f"commit outcome still unknown: {exc}") from exc
        # The pointer is at a higher version naming another root (or gone): our put can
        # never apply any more, so nobody can hold these objects.
        self._discard(written)
        self.conflicts += 1
        if pointer is None:
            raise StreamDeletedError(f"stream {self.incarnation} was deleted") from exc
        if pointer.epoch > self.epoch:
            raise DeposedError(
                f"{self.incarnation}: pointer epoch {pointer.epoch} > ours {self.epoch}"
            ) from exc
        before = self.tree.next_offset
        self.load()
        if self.tree.next_offset != before:
            raise DeposedError(
                f"{self.incarnation}: manifest moved from {before} to {self.tree.next_offset} "
                "under a writer of the same epoch"
            ) from exc
        raise CommitRetryError(f"commit lost a race, reloaded the manifest: {exc}") from exc

    def _retry_identical_put(self, uid: bytes, sealed: bool, attempts: int = 3) -> int | None:
        for _ in range(attempts):
            try:
                return self.catalog.put_pointer(
                    self.incarnation, uid.hex(), self.epoch, self.pointer.version, sealed=sealed
                )
            except TransientError:
                continue
            except StorageError:
                return None  # moved on (conflict, fenced or deleted): the pointer decides
        return None

    def _discard(self, keys: list[str]) -> None:
        try:
            self.remote.store.delete_many(keys)
        except StorageError:
            log.warning("unpublished_manifest_objects_not_deleted", keys=keys)
