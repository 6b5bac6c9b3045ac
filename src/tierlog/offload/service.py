"""Segment-mode tiering of one stream: triggers, commit, deletion lag, remote retention.

A stream created with ``tier_mode = segments`` is tiered by this service instead of the
fragment tierer. Sealed, committed local segments are offloaded whole (oldest first, so the
manifest stays one contiguous range) when

* the local bytes not yet offloaded exceed ``offload_threshold_bytes``,
* a segment has been sealed for ``offload_threshold_age_seconds``, or
* an operator asked for every segment before an offset (``request_offload``).

Commit order of one segment: the offloader writes the data object and the index object
(the attempt's UUID recorded in the MetaStore first) → the manifest commit writes the new root
and moves the pointer with the same committer, optimistic concurrency and epoch fencing as
fragments → ``offloader.finish`` drops the attempt record. A crash between any two steps
leaves an attempt that ``start`` settles with ``offloader.recover``: kept when the manifest
holds its entry, cleaned up otherwise.

A local segment is deleted once its offload is committed and ``offload_deletion_lag_seconds``
has passed since — or earlier when free disk is under the floor (counted in
``early_deletions``). Remote retention trims whole segments through the committer, whose
pending-deletion list removes both objects (``run_deletions``). The committer, the retention
rule and the pending-deletion list come from the caller (the server), since the fragment
tierer's package is a sibling of this one.

After every manifest commit the service tells the log the remote position (the stream's
first offset and the offloaded tail, ``_publish_position``), as the fragment tierer does:
a cluster leader sends it to its members (``TIERED``), which free the local segments the
bucket holds, and truncation refuses to cut below it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Protocol

from tierlog import __version__
from tierlog.concurrency import SharedTimer, TimerHandle
from tierlog.errors import TierlogError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.segment_files import SegmentRef
from tierlog.log.segments import SegmentInfo
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.offload.errors import OffloadRunningError
from tierlog.offload.offloader import ObjectStoreOffloader, RecoveryReport
from tierlog.remote.errors import OffsetBeyondEndError, OffsetOvertakenError
from tierlog.remote.fragments import FragmentEntry, segment_entry
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.settings import StreamSettings
from tierlog.storage.errors import NotFoundError, StorageError
from tierlog.storage.object_store import ObjectStore

log = get_logger(__name__)


class ManifestCommits(Protocol):
    """What this service needs of the manifest committer (``tiering.committer``)."""

    epoch: int

    @property
    def tree(self) -> ManifestTree: ...

    def load(self) -> ManifestTree: ...

    def commit(
        self, entries: Sequence[FragmentEntry], trim_to: int | None = None
    ) -> ManifestTree: ...


@dataclass(frozen=True, slots=True)
class OffloadStatus:
    """The admin view: ``state`` is ``not run``, ``running``, ``success`` or ``error``."""

    state: str
    before: int | None
    error: str | None
    first_unoffloaded: int
    offloaded_segments: int

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.state,
            "before": self.before,
            "error": self.error,
            "first_unoffloaded_offset": self.first_unoffloaded,
            "offloaded_segments": self.offloaded_segments,
        }


def _ignore_step(name: str) -> None:
    pass


def _timer_failed(exc: BaseException) -> None:
    log.error("offload_timer_failed", error=repr(exc))


class SegmentOffloadService:
    """Offloads one stream's sealed segments and deletes local copies after the lag."""

    def __init__(
        self,
        stream_log: StreamLog,
        offloader: ObjectStoreOffloader,
        committer: ManifestCommits,
        settings: Callable[[], StreamSettings],
        *,
        min_free_disk_bytes: int = 0,
        retention_trim: Callable[[ManifestTree], int | None] | None = None,
        run_deletions: Callable[[], object] | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        step_hook: Callable[[str], None] = _ignore_step,
        pool: Executor | None = None,
        timer: SharedTimer | None = None,
    ) -> None:
        # passes run on ``pool`` and are armed on ``timer``: the server hands every
        # segment-mode stream the node's shared tiering pool and timer, so a stream holds
        # no thread of its own; without them (a standalone service) it makes a small pair
        self._pool = pool
        self._timer = timer
        self._owns_threads = pool is None or timer is None
        self._pass_running = False
        self._pass_again = False
        self._pass_future: Future[None] | None = None
        self._timer_handle: TimerHandle | None = None
        self.log = stream_log
        self.offloader = offloader
        self.committer = committer
        self.settings = settings
        self.min_free_disk_bytes = min_free_disk_bytes
        self.retention_trim = retention_trim
        self.run_deletions = run_deletions
        self.interval = interval
        self.clock = clock
        self._step = step_hook
        self.stream_dir = offloader.stream_dir
        self.lag_bytes = 0
        self.early_deletions = 0
        self.offloaded_segments = 0
        self.halted: str | None = None
        self._committed_at: dict[int, float] = {}  # first offset -> when its offload committed
        self._lock = threading.Lock()
        # held for a whole offload (upload and commit): the stream's retention frees
        # never-offloaded segments only while no offload runs, so the manifest and the
        # local log stay one contiguous range
        self._offload_lock = threading.Lock()
        self._stopping = False
        self._request: int | None = None  # an operator's "before" not yet run
        self._state = "not run"
        self._before: int | None = None
        self._error: str | None = None

    # -- CommittedManifest (for readers) ----------------------------------------------------
    @property
    def object_store(self) -> ObjectStore:
        return self.offloader.store

    def committed_tree(self) -> ManifestTree:
        return self.committer.tree

    def refresh_committed(self) -> ManifestTree:
        return self.committer.tree

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> RecoveryReport:
        """Load the manifest, fence older writers with an empty commit (epoch), settle the
        attempts a crash left behind, then run the trigger loop on a thread."""
        tree = self.committer.load()
        self.log.set_stream_first_offset(tree.first_offset)
        if tree.next_offset > self.log.next_offset:
            self._restart_local(tree)
        self.committer.commit([])
        self._publish_position()
        report = self.offloader.recover(self.is_committed)
        if report.cleaned or report.kept or report.stray_uploads_aborted:
            log.info(
                "offload_recovered",
                stream=self.stream_dir,
                cleaned=len(report.cleaned),
                kept=len(report.kept),
                stray_uploads=report.stray_uploads_aborted,
            )
        if self._owns_threads:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="offload-pass")
            self._timer = SharedTimer("offload-timer", _timer_failed)
        self._arm(self.interval)
        return report

    def _restart_local(self, tree: ManifestTree) -> None:
        """The remote tier is ahead of the local log (its directory was lost or replaced):
        continue the local log past it, so no offset is handed out twice, with a higher
        epoch and the tracking state replayed from the last offloaded segment."""
        epoch = max(self.committer.epoch, self.log.max_epoch + 1)
        tracking = TrackingState()
        entry = tree.locate_offset(tree.next_offset - 1, self.offloader.store.get).entry
        if entry.is_segment:
            handle = self.offloader.read_offloaded(
                entry.first_offset, entry.uuid, require_sealed=tree.sealed
            )
            with handle.reader(OffsetSpec.first(), user_only=False) as reader:
                for chunk in reader.chunks():
                    raw = chunk.raw
                    assert raw is not None

                    def read(position: int, length: int, raw: memoryview = raw) -> memoryview:
                        return raw[position : position + length]

                    replay_chunk(tracking, chunk.header, 0, read)
        log.warning(
            "local_log_restarted_past_remote",
            stream_dir=self.stream_dir,
            remote_next_offset=tree.next_offset,
            local_next_offset=self.log.next_offset,
            epoch=epoch,
        )
        self.log.restart_at(
            tree.next_offset, epoch, tracking.to_bytes(), tree.header().max_timestamp
        )

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._stopping = True
            handle, self._timer_handle = self._timer_handle, None
            running = self._pass_future
        if handle is not None:
            handle.cancel()
        if running is not None:
            futures_wait([running], timeout)
        if self._owns_threads:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self._timer is not None:
                self._timer.shutdown()

    def is_committed(self, first_offset: int, uuid: uuid_module.UUID) -> bool:
        """Whether the manifest holds the offload of ``first_offset`` by attempt ``uuid``."""
        tree = self.committer.tree
        try:
            loc = tree.locate_offset(first_offset, self.offloader.store.get)
        except (OffsetOvertakenError, OffsetBeyondEndError):
            return False
        entry = loc.entry
        return entry.is_segment and entry.first_offset == first_offset and entry.uid == uuid.bytes

    # -- operator requests ------------------------------------------------------------------
    def request_offload(self, before: int) -> None:
        """Offload every sealed segment whose next offset is <= ``before`` (asynchronously;
        ``status`` tells how it went). OffloadRunningError while one is running."""
        with self._lock:
            if self._state == "running" or self._request is not None:
                raise OffloadRunningError(
                    f"an offload of {self.stream_dir} (before {self._before}) is running"
                )
            self._request = before
            self._before = before
            self._state = "running"
            self._error = None
        self._arm(0.0)

    def status(self) -> OffloadStatus:
        with self._lock:
            return OffloadStatus(
                self._state,
                self._before,
                self._error,
                max(self.committer.tree.next_offset, self.log.segment_refs()[0].first_offset),
                self.offloaded_segments,
            )

    # -- the loop ---------------------------------------------------------------------------
    def _arm(self, delay: float) -> None:
        """The next pass in ``delay`` seconds (an earlier armed pass is replaced)."""
        assert self._timer is not None
        with self._lock:
            if self._stopping:
                return
            if self._timer_handle is not None:
                self._timer_handle.cancel()
            self._timer_handle = self._timer.call_later(delay, self._due)

    def _due(self) -> None:
        """Timer callback: hand one pass to the pool (never two of one stream at once)."""
        assert self._pool is not None
        with self._lock:
            self._timer_handle = None
            if self._stopping:
                return
            if self._pass_running:
                self._pass_again = True  # the running pass re-arms at once when it ends
                return
            self._pass_running = True
            try:
                self._pass_future = self._pool.submit(self._pass)
            except RuntimeError:  # the shared pool is shut down: the server is stopping
                self._pass_running = False

    def _pass(self) -> None:
        try:
            if not self._stopping:
                self.run_once()
        except Exception as exc:  # logged and retried next pass; never stops the schedule
            log.error("offload_pass_failed", stream=self.stream_dir, error=repr(exc))
        finally:
            with self._lock:
                self._pass_running = False
                again, self._pass_again = self._pass_again, False
            self._arm(0.0 if again else self.interval)

    def run_once(self) -> int:
        """One pass: the operator's request, then the triggers, then remote retention.
        Returns how many segments were offloaded."""
        with self._lock:
            before = self._request
            self._request = None
        done = 0
        if before is not None:
            try:
                done += self._offload_all(self._due_before(before))
            except Exception as exc:
                with self._lock:
                    self._state, self._error = "error", f"{type(exc).__name__}: {exc}"
            else:
                with self._lock:
                    self._state = "success"
        done += self._offload_all(self.due_by_triggers())
        self._apply_remote_retention()
        if self.run_deletions is not None:
            self.run_deletions()  # the pending-deletion list: trimmed segments, old roots
        return done

    def _candidates(self) -> list[SegmentInfo]:
        """Sealed, committed segments not offloaded yet, oldest first."""
        tree = self.committer.tree
        committed = self.log.commit_point().next_offset
        start = tree.next_offset
        listed = self.log.list_segments()[:-1]  # never the last: it is (or was) the active one
        return [
            s
            for s in listed
            if s.sealed
            and s.num_chunks > 0
            and s.next_offset <= committed
            and s.first_offset >= start
        ]

    def _due_before(self, before: int) -> list[SegmentInfo]:
        return [s for s in self._candidates() if s.next_offset <= before]

    def due_by_triggers(self) -> list[SegmentInfo]:
        """The segments the size and age thresholds want offloaded now; their bytes are the
        stream's lag for back-pressure (sealed bytes past the thresholds)."""
        settings = self.settings()
        size, age = settings.offload_threshold_bytes, settings.offload_threshold_age_seconds
        candidates = self._candidates()
        due: list[SegmentInfo] = []
        if size is not None:
            start = self.committer.tree.next_offset
            pending = sum(s.size for s in self.log.list_segments() if s.next_offset > start)
            for s in candidates:
                if pending <= size:
                    break
                due.append(s)
                pending -= s.size
        if age is not None:
            cutoff = self.clock() - age
            for s in candidates[len(due) :]:
                if _sealed_at(s) > cutoff:
                    break
                due.append(s)
        self.lag_bytes = sum(s.size for s in due)
        return due

    def _offload_all(self, segments: list[SegmentInfo]) -> int:
        for s in segments:
            self.offload_segment(s)
            self.lag_bytes = max(0, self.lag_bytes - s.size)
        return len(segments)

    def offload_segment(self, segment: SegmentInfo) -> FragmentEntry | None:
        """Offload one sealed segment and commit it to the manifest (None: the stream's
        retention freed it meanwhile)."""
        with self._offload_lock:
            if segment.first_offset not in {r.first_offset for r in self.log.segment_refs()}:
                return None
            return self._offload_segment(segment)

    def _offload_segment(self, segment: SegmentInfo) -> FragmentEntry:
        uuid = uuid_module.uuid4()
        ref = SegmentRef(segment.first_offset, segment.segment_path, segment.index_path)
        extra = {
            "tierlog-stream": self.stream_dir,
            "tierlog-software-version": __version__,
        }
        result = self.offloader.offload(ref, uuid, extra)
        self._step("offloaded")
        entry = segment_entry(
            self.offloader.prefix,
            self.stream_dir,
            result.first_offset,
            result.next_offset,
            uuid,
            min_timestamp=result.min_timestamp,
            max_timestamp=result.max_timestamp,
            segment_size=result.segment_size,
            chunk_count=result.chunk_count,
        )
        try:
            self.committer.commit([entry])
        except TierlogError:
            self._settle_failed_commit(result.first_offset, uuid)
            raise
        self._publish_position()
        self._step("committed")
        self.offloader.finish(result.first_offset, uuid)
        self._step("finished")
        self._committed_at[result.first_offset] = self.clock()
        self.offloaded_segments += 1
        log.info(
            "segment_offloaded",
            stream=self.stream_dir,
            first_offset=result.first_offset,
            next_offset=result.next_offset,
            bytes=result.segment_size,
            blocks=result.block_count,
        )
        return entry

    def _settle_failed_commit(self, first: int, uuid: uuid_module.UUID) -> None:
        """The commit raised: keep the objects only if the manifest holds them after all."""
        try:
            self.committer.load()
            if self.is_committed(first, uuid):
                return
            self.offloader.delete_offloaded(first, uuid)
            self.offloader.finish(first, uuid)
        except (TierlogError, OSError) as exc:  # the record stays: ``recover`` finishes it
            log.warning("offload_cleanup_deferred", stream=self.stream_dir, error=repr(exc))

    def _apply_remote_retention(self) -> None:
        if self.retention_trim is None:
            return
        tree = self.committer.tree
        trim_to = self.retention_trim(tree)
        if trim_to is not None and trim_to > tree.first_offset:
            self.committer.commit([], trim_to=trim_to)
            self._publish_position()
            log.info("offloaded_segments_trimmed", stream=self.stream_dir, to=trim_to)

    def _publish_position(self) -> None:
        """Tell the log what the committed manifest holds: the stream starts at its first
        offset, every offset below its tail is offloaded (``StreamLog.remote_position``,
        which a cluster leader sends its members)."""
        tree = self.committer.tree
        self.log.set_stream_first_offset(tree.first_offset)
        self.log.set_tiered_offset(tree.next_offset)

    # -- local deletion (on the log's writer thread) ----------------------------------------
    def apply_local_deletion(self) -> list[int]:
        """Delete the oldest local segments that are offloaded and past the deletion lag
        (under the free-disk floor the lag is waived), that remote retention removed, or
        that the stream's retention removes while nothing older is held remotely."""
        offloading = not self._offload_lock.acquire(blocking=False)
        try:
            return self._apply_local_deletion(may_drop_unoffloaded=not offloading)
        finally:
            if not offloading:
                self._offload_lock.release()

    def _apply_local_deletion(self, may_drop_unoffloaded: bool) -> list[int]:
        tree = self.committer.tree
        settings = self.settings()
        lag = settings.offload_deletion_lag_seconds
        now = self.clock()
        listed = self.log.list_segments()
        total = sum(s.size for s in listed) + (0 if tree.is_empty else tree.header().total_bytes)
        freed: list[int] = []
        for s in listed:
            if not s.sealed:
                break
            if s.next_offset <= tree.first_offset:
                pass  # remote retention removed it from the stream
            elif s.next_offset <= tree.next_offset:
                committed = self._commit_time(s.first_offset, now)
                if committed + lag > now:
                    if not self._disk_below_floor():
                        break
                    self.early_deletions += 1
            elif not (
                may_drop_unoffloaded
                and tree.is_empty
                and self._over_retention(s, total, settings, now)
            ):
                break
            self.log.delete_segment(s.first_offset)
            self._committed_at.pop(s.first_offset, None)
            total -= s.size
            freed.append(s.first_offset)
        return freed

    def _over_retention(
        self, segment: SegmentInfo, total: int, settings: StreamSettings, now: float
    ) -> bool:
        """Whether the stream's retention removes this oldest, never offloaded segment (the
        remote tier holds nothing older, so the stream stays one contiguous range)."""
        if settings.max_bytes is not None and total > settings.max_bytes:
            return True
        if settings.max_age_seconds is None:
            return False
        chunks = self.log.segment_chunks(segment.first_offset)
        newest = chunks[-1].timestamp if chunks else 0
        return newest < (now - settings.max_age_seconds) * 1000

    def _commit_time(self, first: int, now: float) -> float:
        """When the offload of ``first`` was committed: remembered, else its index object's
        modification time (after a restart), else now (the lag starts over)."""
        known = self._committed_at.get(first)
        if known is not None:
            return known
        tree = self.committer.tree
        stamp = now
        try:
            entry = tree.locate_offset(first, self.offloader.store.get).entry
            if entry.is_segment:
                modified = self.offloader.store.head(entry.index_key).last_modified
                stamp = now if modified is None else min(now, modified)
        except (TierlogError, NotFoundError, StorageError, OffsetOvertakenError):
            pass
        self._committed_at[first] = stamp
        return stamp

    def _disk_below_floor(self) -> bool:
        if self.min_free_disk_bytes <= 0:
            return False
        return shutil.disk_usage(self.log.stream_dir).free < self.min_free_disk_bytes


def _sealed_at(segment: SegmentInfo) -> float:
    """When a sealed segment was last written (its file's modification time)."""
    try:
        return os.stat(segment.segment_path).st_mtime
    except FileNotFoundError:
        return time.time()
