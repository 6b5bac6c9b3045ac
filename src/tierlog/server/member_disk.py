"""Local retention on a cluster member: the I/O around ``cluster.member_retention``.

Every ``tier.local_retention_interval_seconds`` (as the leader's tiering housekeeping),
for each stream this node follows whose leader told it its remote position (``TIERED``,
``ReplicationHub.remote_positions``): gather what the member knows (the stream's local
limits from its catalog record, the commit it learned, the manifest its consumers read
here), let the pure decision pick segments, and delete them on the stream's writer lane,
where the acceptor appends, so the log has one writer at a time. Nothing else changes:
the leader keeps deciding retention and tiering; a member only frees what the leader's
remote tier already holds.

A segment-mode stream (its leader offloads whole segments) is decided by the same
module with the deletion lag in place of the local limits: this shell remembers when it
first saw each segment durable (``stamp_durable``, in memory: after a restart the lag
starts over) and whether the disk is under ``tier.min_free_disk_bytes``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field, replace

from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.member_retention import (
    MemberRetentionInput,
    OffloadLag,
    durable_next,
    member_segments_to_free,
    stamp_durable,
)
from tierlog.errors import TierlogError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.server.cluster_members import Followers
from tierlog.tiering.retention import describe_segments

log = get_logger("tierlog.server.cluster")


@dataclass(slots=True)
class _Newest:
    """A sealed segment's newest chunk timestamp, read once (its chunks never change)."""

    by_segment: dict[int, int] = field(default_factory=dict)
    durable_since: dict[int, int] = field(default_factory=dict)
    """Segment mode: when this member first saw each segment durable (ms)."""


class MemberDisk:
    """Frees the local segments of followed streams that the leader made durable."""

    def __init__(
        self,
        followers: Followers,
        hub: ReplicationHub,
        interval: float,
        min_free_disk_bytes: int = 0,
    ) -> None:
        self.followers = followers
        self.hub = hub
        self.interval = max(0.05, interval)
        self.min_free_disk_bytes = min_free_disk_bytes
        self.freed_segments = 0
        self._newest: dict[str, _Newest] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.pass_once()

    async def pass_once(self) -> None:
        loop = asyncio.get_running_loop()
        followers = self.followers
        for incarnation in list(self._newest):
            if incarnation not in followers.streams:
                del self._newest[incarnation]
        for incarnation, follower in list(followers.streams.items()):
            position = self.hub.remote_positions.get(incarnation)
            if position is None or len(follower.log.segment_refs()) < 2:
                continue  # nothing tiered known yet, or only the open segment
            settings = follower.record.settings
            reads = followers.reads
            segments_mode = settings.tier_mode == "segments"
            known = MemberRetentionInput(
                # segment mode: the leader applies no local limit, only the deletion lag
                local_max_bytes=None if segments_mode else settings.local_max_bytes,
                local_max_age_seconds=None if segments_mode else settings.local_max_age_seconds,
                remote_first=position[0],
                tiered_offset=position[1],
                commit_chunk_id=followers.commits.get(incarnation, -1),
                tail_chunk_id=-1,  # read on the writer lane (``_free``)
                readers_remote_next=None
                if reads is None
                else reads.readers_remote_next(incarnation),
                offload=OffloadLag(settings.offload_deletion_lag_seconds)
                if segments_mode
                else None,
            )
            newest = self._newest.setdefault(incarnation, _Newest())
            try:
                freed = await loop.run_in_executor(
                    follower.lane, self._free, follower.log, known, newest, self.min_free_disk_bytes
                )
            except (TierlogError, OSError) as exc:  # closed meanwhile, or the disk
                log.warning(
                    "member_local_retention_failed", stream=follower.record.name, error=repr(exc)
                )
                continue
            if freed:
                self.freed_segments += len(freed)
                log.info(
                    "member_local_segments_freed",
                    stream=follower.record.name,
                    segments=freed,
                    tiered_offset=position[1],
                    mode=settings.tier_mode,
                )

    @staticmethod
    def _free(
        stream_log: StreamLog, known: MemberRetentionInput, newest: _Newest, min_free: int
    ) -> list[int]:
        """On the stream's writer lane: decide and delete."""
        if stream_log.closed:
            return []
        known = replace(known, tail_chunk_id=stream_log.tail()[1])
        listed = stream_log.list_segments()
        counts = {s.first_offset: s.num_chunks for s in listed}
        cache = newest.by_segment

        def newest_of(first: int) -> int:
            if known.local_max_age_seconds is None:
                return 0  # not needed: spare reading the segment's index
            if first in cache:
                return cache[first]
            chunks = stream_log.segment_chunks(first)
            stamp = chunks[-1].timestamp if chunks else 0
            if len(chunks) == counts[first]:
                cache[first] = stamp
            return stamp

        segments = describe_segments(
            [(s.first_offset, s.next_offset, s.size, s.sealed) for s in listed], newest_of
        )
        newest.by_segment = {f: cache[f] for f in counts if f in cache}
        now_ms = int(time.time() * 1000)
        if known.offload is not None:
            newest.durable_since = stamp_durable(
                segments, durable_next(known), newest.durable_since, now_ms
            )
            low = min_free > 0 and shutil.disk_usage(stream_log.stream_dir).free < min_free
            lag = replace(known.offload, durable_since_ms=newest.durable_since, disk_low=low)
            known = replace(known, offload=lag)
        freed = member_segments_to_free(segments, known, now_ms)
        for first in freed:
            stream_log.delete_segment(first)
        return freed
