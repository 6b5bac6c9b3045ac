"""The segment offloader: Pulsar's ``LedgerOffloader`` for Osiris segments.

``offload`` copies one sealed segment to the object store as a block-format data object (a
multipart upload, one part per block from part 1, streamed from the segment file with
``os.preadv``: the next block is read while the current one uploads, so two blocks at most are
in memory, never the segment) plus an index object
(``tierlog.formats.offload``). An encrypted stream's segments go in format 2
(``tierlog.formats.offload_sealed``): each chunk sealed as its own frame under the data
object's key (``offload.sealed_blocks``), the index sealed whole. ``read_offloaded`` returns a
handle whose readers behave like local segment readers (either format);
``delete_offloaded`` removes both objects.

Every attempt has a UUID, recorded in the MetaStore before anything is uploaded, with the
multipart upload id recorded right after initiation; the object keys carry the UUID. The
record stays until the caller has committed the offload (then ``finish``) — a crash at any
step leaves either a committed offload or a recorded attempt that ``recover`` cleans up
(abort the upload, delete both objects). ``recover`` also aborts stray multipart uploads
under the stream's segment prefix that no running attempt owns.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid as uuid_module
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from tierlog.errors import ConfigError
from tierlog.formats.errors import FormatError
from tierlog.formats.offload import (
    DEFAULT_BLOCK_SIZE,
    FORMAT_VERSION,
    FORMAT_VERSION_KEY,
    OffloadIndex,
    build_index,
    check_block_size,
    encode_index,
    required_block_size,
)
from tierlog.formats.offload_sealed import (
    SEALED_FORMAT_VERSION,
    SealedOffloadIndex,
    build_sealed_index,
    encode_sealed_index,
)
from tierlog.log.segment_files import SegmentRef
from tierlog.logs import get_logger
from tierlog.offload.attempts import Attempt, AttemptLog
from tierlog.offload.errors import (
    AttemptExistsError,
    OffloadedDataCorruptError,
    OffloadNotFoundError,
    OffloadSourceError,
)
from tierlog.offload.keys import data_key, index_key, parse_offload_key, segments_prefix
from tierlog.offload.reader import OffloadedSegment
from tierlog.offload.sealed_blocks import seal_block
from tierlog.offload.source import SegmentSource, fill_block, load_source, read_entries
from tierlog.remote.encryption import Keyring
from tierlog.remote.sealing import new_object_cipher, seal_object
from tierlog.remote.segments import decode_offload_index
from tierlog.remote.settings import StreamSettings
from tierlog.storage.errors import InvalidKeyError, NotFoundError
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import MultipartUpload, ObjectStore

log = get_logger(__name__)

DEFAULT_INDEX_CACHE = 64


@dataclass(frozen=True, slots=True)
class OffloadResult:
    """A completed offload: what a manifest entry of kind "segment" needs."""

    first_offset: int
    next_offset: int
    uuid: uuid_module.UUID
    data_key: str
    index_key: str
    data_object_length: int
    index_length: int
    segment_size: int
    chunk_count: int
    block_count: int
    min_timestamp: int
    max_timestamp: int
    max_epoch: int
    puts: int  # object-store write requests: initiate, parts, complete, index


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    cleaned: tuple[Attempt, ...]  # attempts whose objects and upload were removed
    kept: tuple[Attempt, ...]  # attempts found committed: only the record was dropped
    stray_uploads_aborted: int


class SegmentOffloader(ABC):
    """Offload sealed segments whole, read them back, delete them (Pulsar's
    ``LedgerOffloader``: ``offload`` / ``readOffloaded`` / ``deleteOffloaded``)."""

    @abstractmethod
    def offload(
        self,
        segment: SegmentRef,
        attempt_uuid: uuid_module.UUID,
        extra_metadata: Mapping[str, str],
    ) -> OffloadResult:
        """Copy every chunk of the sealed ``segment`` to the object store under
        ``attempt_uuid``; ``extra_metadata`` (stream, segment, software version, ...) goes
        into both objects' user metadata, for inspection and debugging only."""

    @abstractmethod
    def read_offloaded(self, segment: int, attempt_uuid: uuid_module.UUID) -> OffloadedSegment:
        """The offloaded segment whose first offset is ``segment``: open readers on it like
        on a local segment."""

    @abstractmethod
    def delete_offloaded(self, segment: int, attempt_uuid: uuid_module.UUID) -> None:
        """Delete the offloaded segment's objects (missing ones are not an error)."""


class ObjectStoreOffloader(SegmentOffloader):
    """The offloader of one stream over an ``ObjectStore`` (filesystem or S3).

    ``block_size``: the configured block (= part) size, at least 5 MiB; a segment with a
    chunk larger than ``block_size - 140`` is cut into blocks of that chunk + 140 bytes
    instead (each block must hold a whole chunk; readers learn the size from the index).
    ``verify_crc``: check each chunk's header and data CRC while uploading, so a segment
    damaged on disk is refused rather than offloaded. ``settings``: the stream's current
    settings; when they ask for encryption a segment is offloaded in format 2 (every entry
    a frame sealed under the data object's own key, the index sealed: see
    ``formats.offload_sealed``), with ``keyring`` (default: the process's) for new keys and
    for reading.
    """

    def __init__(
        self,
        store: ObjectStore,
        meta: MetaStore,
        prefix: str,
        stream_dir: str,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        verify_crc: bool = True,
        index_cache: int = DEFAULT_INDEX_CACHE,
        read_bytes: int = 4 * 1024 * 1024,
        step_hook: Callable[[str], None] | None = None,
        settings: Callable[[], StreamSettings] | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        try:
            self.block_size = check_block_size(block_size)
        except FormatError as exc:
            raise ConfigError(f"offload block size: {exc}") from exc
        self.store = store
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.attempts = AttemptLog(meta, stream_dir)
        self.verify_crc = verify_crc
        self.read_bytes = read_bytes
        self._step_hook = step_hook
        self._settings = settings
        self._keyring = keyring
        self._lock = threading.Lock()
        self._running: set[uuid_module.UUID] = set()
        self._indexes: OrderedDict[tuple[int, uuid_module.UUID], OffloadedSegment] = OrderedDict()
        self._index_cap = index_cache

    # -- keys -------------------------------------------------------------------------------

    def data_key(self, first_offset: int, uuid: uuid_module.UUID) -> str:
        return data_key(self.prefix, self.stream_dir, first_offset, uuid)

    def index_key(self, first_offset: int, uuid: uuid_module.UUID) -> str:
        return index_key(self.prefix, self.stream_dir, first_offset, uuid)

    def _step(self, name: str) -> None:
        """A named point between two durable steps (tests inject crashes here)."""
        if self._step_hook is not None:
            self._step_hook(name)

    # -- offload ----------------------------------------------------------------------------

    def offload(
        self,
        segment: SegmentRef,
        attempt_uuid: uuid_module.UUID,
        extra_metadata: Mapping[str, str],
    ) -> OffloadResult:
        source = load_source(segment)
        try:
            return self._offload(segment, source, attempt_uuid, extra_metadata)
        finally:
            os.close(source.fd)

    def _offload(
        self,
        segment: SegmentRef,
        source: SegmentSource,
        uuid: uuid_module.UUID,
        extra: Mapping[str, str],
    ) -> OffloadResult:
        meta = source.metadata
        first = meta.first_offset
        sizes = meta.chunk_sizes()
        dkey, ikey = self.data_key(first, uuid), self.index_key(first, uuid)
        settings = self._settings() if self._settings is not None else None
        cipher = (
            new_object_cipher(settings, dkey, keyring=self._keyring)
            if settings is not None
            else None
        )
        index: OffloadIndex
        try:
            if cipher is None:
                block_size = max(self.block_size, required_block_size(int(sizes.max())))
                index, plans = build_index(meta, block_size)
            else:  # blocks of whole frames, each at least the block size: any chunk fits
                index, plans = build_sealed_index(meta, self.block_size, cipher.key_block)
        except FormatError as exc:
            raise OffloadSourceError(f"{segment.segment_path}: {exc}") from exc
        version = FORMAT_VERSION if cipher is None else SEALED_FORMAT_VERSION
        metadata = {
            **extra,
            FORMAT_VERSION_KEY: str(version),
            "tierlog-segment": str(first),
            "tierlog-attempt": uuid.hex,
        }
        # marked running before it is recorded, so a concurrent ``recover`` never takes it
        # for a crashed attempt; a uuid already recorded belongs to another attempt, whose
        # objects the cleanup below must not touch
        with self._lock:
            if uuid in self._running:
                raise AttemptExistsError(f"offload attempt {uuid} is already running")
            self._running.add(uuid)
        try:
            attempt = self.attempts.begin(first, uuid)
        except BaseException:
            with self._lock:
                self._running.discard(uuid)
            raise
        upload: MultipartUpload | None = None
        try:
            self._step("recorded")
            upload = self.store.create_multipart(dkey, metadata=metadata)
            self._step("initiated")
            attempt = self.attempts.set_upload_id(attempt, upload.upload_id)
            self._step("upload-id-recorded")
            crcs = np.zeros(meta.chunk_count, dtype=np.uint32)
            buffers = [bytearray(plans[0].length) for _ in plans[:2]] if cipher is None else []

            def fill(k: int) -> memoryview:
                if cipher is not None:
                    assert isinstance(index, SealedOffloadIndex)
                    return memoryview(
                        seal_block(
                            plans[k],
                            index,
                            cipher,
                            lambda view, slots, lo: read_entries(
                                view, slots, lo, source, crcs, verify=self.verify_crc
                            ),
                        )
                    )
                view = memoryview(buffers[k % 2])[: plans[k].length]
                fill_block(view, plans[k], source, sizes, crcs, verify=self.verify_crc)
                return view

            # block k + 1 is read and checked while block k uploads: two blocks in memory
            with ThreadPoolExecutor(1, thread_name_prefix="tierlog-offload") as pool:
                ready = pool.submit(fill, 0)
                for k, plan in enumerate(plans):
                    view = ready.result()
                    if k + 1 < len(plans):
                        ready = pool.submit(fill, k + 1)
                    upload.put_part(plan.part_number, view)
                    self._step(f"part-{plan.part_number}")
            buffers.clear()
            upload.complete()
            self._step("completed")
            index = replace(index, metadata=replace(meta, chunk_crcs=crcs))
            if isinstance(index, SealedOffloadIndex):
                assert settings is not None
                plain = encode_sealed_index(index)
                encoded = seal_object(settings, ikey, plain, keyring=self._keyring)
            else:
                encoded = encode_index(index)
            self.store.put(ikey, encoded, metadata=metadata)
            self._step("index-written")
        except Exception:
            # best effort now; a recorded attempt that survives is cleaned up by ``recover``
            self._cleanup_after_failure(first, uuid, upload, dkey, ikey)
            raise
        finally:
            with self._lock:
                self._running.discard(uuid)
        records = meta.records
        return OffloadResult(
            first_offset=first,
            next_offset=meta.next_offset,
            uuid=uuid,
            data_key=dkey,
            index_key=ikey,
            data_object_length=index.data_object_length,
            index_length=len(encoded),
            segment_size=meta.segment_size,
            chunk_count=meta.chunk_count,
            block_count=len(plans),
            min_timestamp=int(records["timestamp"].min()),
            max_timestamp=int(records["timestamp"].max()),
            max_epoch=int(records["epoch"].max()),
            puts=len(plans) + 3,
        )

    def _cleanup_after_failure(
        self,
        first: int,
        uuid: uuid_module.UUID,
        upload: MultipartUpload | None,
        dkey: str,
        ikey: str,
    ) -> None:
        try:
            if upload is not None:
                upload.abort()
            self.store.delete_many([dkey, ikey])
            self.attempts.clear(first, uuid)
        except Exception as exc:  # the attempt record stays: ``recover`` finishes the job
            log.warning("offload_cleanup_failed", attempt=str(uuid), segment=first, error=str(exc))

    def finish(self, segment: int, attempt_uuid: uuid_module.UUID) -> None:
        """Forget a committed attempt (call once the offload is recorded durably)."""
        self.attempts.clear(segment, attempt_uuid)

    # -- recovery ---------------------------------------------------------------------------

    def recover(self, is_committed: Callable[[int, uuid_module.UUID], bool]) -> RecoveryReport:
        """Settle every recorded attempt not running in this process: committed ones
        (``is_committed(segment, uuid)``) lose only their record; the others have their
        upload aborted (by the recorded id, and any upload of their data key, which covers
        a crash between initiation and recording the id), both objects deleted, and then
        their record removed. Finally abort stray uploads under the stream's segment prefix
        that no running attempt owns."""
        recorded = self.attempts.list()
        with self._lock:  # after listing: every attempt recorded by this process is in it
            running = set(self._running)
        cleaned: list[Attempt] = []
        kept: list[Attempt] = []
        pending = list(
            self.store.list_multipart_uploads(segments_prefix(self.prefix, self.stream_dir))
        )
        for attempt in recorded:
            if attempt.uuid in running:
                continue
            first, uuid = attempt.first_offset, attempt.uuid
            if is_committed(first, uuid):
                self.attempts.clear(first, uuid)
                kept.append(attempt)
                continue
            dkey = self.data_key(first, uuid)
            if attempt.upload_id is not None:
                self.store.abort_multipart(dkey, attempt.upload_id)
            for upload in pending:
                if upload.key == dkey:
                    self.store.abort_multipart(upload.key, upload.upload_id)
            self.store.delete_many([dkey, self.index_key(first, uuid)])
            self._forget(first, uuid)
            self.attempts.clear(first, uuid)
            cleaned.append(attempt)
        strays = 0
        for upload in self.store.list_multipart_uploads(
            segments_prefix(self.prefix, self.stream_dir)
        ):
            try:
                owner = parse_offload_key(upload.key, self.prefix, self.stream_dir).uuid
            except InvalidKeyError:
                owner = None
            if owner is not None and owner in running:
                continue
            self.store.abort_multipart(upload.key, upload.upload_id)
            strays += 1
        return RecoveryReport(tuple(cleaned), tuple(kept), strays)

    # -- read and delete --------------------------------------------------------------------

    def read_offloaded(
        self, segment: int, attempt_uuid: uuid_module.UUID, *, require_sealed: bool = False
    ) -> OffloadedSegment:
        """The offloaded segment, its index object fetched once and cached.
        ``require_sealed``: the manifest naming it is sealed, so a plaintext index is
        refused (``OffloadedDataCorruptError``)."""
        cache_key = (segment, attempt_uuid)
        with self._lock:
            cached = self._indexes.get(cache_key)
            if cached is not None and (cached.entries.sealed or not require_sealed):
                self._indexes.move_to_end(cache_key)
                return cached
        ikey = self.index_key(segment, attempt_uuid)
        try:
            raw = self.store.get(ikey)
        except NotFoundError:
            raise OffloadNotFoundError(
                f"offloaded segment {segment} (attempt {attempt_uuid}) not found: {ikey!r}"
            ) from None
        try:
            index = decode_offload_index(
                ikey, raw, keyring=self._keyring, require_sealed=require_sealed
            )
        except FormatError as exc:
            raise OffloadedDataCorruptError(f"{ikey}: {exc}") from exc
        if index.metadata.first_offset != segment:
            raise OffloadedDataCorruptError(
                f"{ikey}: index is of segment {index.metadata.first_offset}, not {segment}"
            )
        handle = OffloadedSegment(
            self.store,
            self.data_key(segment, attempt_uuid),
            index,
            read_bytes=self.read_bytes,
            keyring=self._keyring,
        )
        with self._lock:
            self._indexes[cache_key] = handle
            while len(self._indexes) > self._index_cap:
                self._indexes.popitem(last=False)
        return handle

    def _forget(self, segment: int, uuid: uuid_module.UUID) -> None:
        with self._lock:
            self._indexes.pop((segment, uuid), None)

    def delete_offloaded(self, segment: int, attempt_uuid: uuid_module.UUID) -> None:
        self._forget(segment, attempt_uuid)
        with contextlib.suppress(NotFoundError):
            self.store.delete_many(
                [self.data_key(segment, attempt_uuid), self.index_key(segment, attempt_uuid)]
            )
