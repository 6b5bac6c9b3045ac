"""A deleted stream's bytes leave every node's disk, not only the deleting node's.

Deleting a stream removes its catalog key and writes its tombstone
(``Catalog.mark_deleted``). The node that ran the deletion removes its own directory at
once; every other node of a cluster finds out on its directory scan (every
``cluster.scan_interval_seconds``, and on the first scan after it starts, so a node that
was down at the time catches up when it comes back): a local stream directory, a
followed stream or a led stream whose incarnation is not in the catalog is a
*candidate*, and a candidate whose tombstone exists is removed: a led stream steps down
and is closed first (its consumers are told), a followed stream stops being followed
(its member consumers get a MetadataUpdate), then the directory goes.

Never on doubt: a candidate without a tombstone is kept (and logged once as
``stream_directory_unknown``): a catalog read that lacks a stream could also come from
a MetaStore that is not this cluster's, a restored older copy, or a directory some
other tool put there. A MetaStore that does not answer fails the scan before anything
is decided. Incarnations are unique (they carry the creation time in nanoseconds), so
a tombstone can never name a live stream.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tierlog.log.errors import InvalidStreamNameError
from tierlog.log.names import validate_dir_name
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

log = get_logger("tierlog.server.cluster")


def local_incarnations(streams_dir: str) -> set[str]:
    """The stream directories under ``streams_dir`` (names of the incarnation form)."""
    try:
        names = os.listdir(streams_dir)
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:  # no stat per entry: this runs on every scan
        try:
            validate_dir_name(name)
        except InvalidStreamNameError:
            continue
        out.add(name)
    return out


def deletion_candidates(held: Iterable[str], live: Iterable[str]) -> set[str]:
    """Incarnations held here (on disk, followed or led) that the catalog does not list:
    each may have been deleted, which only its tombstone can confirm."""
    return set(held) - set(live)


class DeletedStreams:
    """The scan's pass over deleted streams on one cluster node."""

    def __init__(self, service: ClusterService, streams_dir: str) -> None:
        self.service = service
        self.streams_dir = streams_dir
        self.removed = 0  # directories removed because their stream was deleted
        self._unknown: set[str] = set()  # candidates without a tombstone (logged once)
        self._closing: dict[str, StreamLog] = {}  # led streams stepped down, until closed

    async def held_here(self) -> set[str]:
        """Every incarnation this node holds (directories, followed, led). Taken before
        the scan reads the catalog: a stream created in between is not among them, so
        only streams the catalog really lacks become candidates."""
        service = self.service
        on_disk = await service._directory(local_incarnations, self.streams_dir)
        followed = set(service.followers.streams) if service.followers is not None else set()
        return on_disk | followed | set(service.handles)

    async def sweep(self, held: set[str], records: list[StreamRecord]) -> None:
        """``held``: ``held_here()`` from before ``records`` (the catalog) was read."""
        service = self.service
        followers = service.followers
        broker = service.broker
        candidates = deletion_candidates(held, (r.incarnation for r in records))
        if not candidates:
            return
        open_here: set[str] = set()  # open or being opened by the broker here
        if broker is not None:
            open_here = {h.record.incarnation for h in broker.streams()}
            open_here |= {
                o.record.incarnation for o in broker.opening_streams() if o.state == "resolving"
            }
        catalog = service.catalog
        for incarnation in sorted(candidates):
            if not await service._directory(catalog.is_deleted, incarnation):
                if incarnation not in self._unknown:
                    self._unknown.add(incarnation)
                    log.warning(
                        "stream_directory_unknown",
                        incarnation=incarnation,
                        reason="not in the catalog and no tombstone: kept",
                    )
                continue
            handle = service.handles.get(incarnation)
            if handle is not None:
                # led here: step down and close it; the directory goes once it is closed
                self._closing[incarnation] = handle.log
                service._step_down(incarnation, "stream deleted")
                continue
            closing = self._closing.get(incarnation)
            if incarnation in open_here or (closing is not None and not closing.closed):
                continue  # still closing (released after the step-down above)
            self._closing.pop(incarnation, None)
            if followers is not None and followers.get(incarnation) is not None:
                await followers.stop(incarnation)
            await self._remove(incarnation)

    async def deleted_here(self, incarnation: str) -> None:
        """This node ran the deletion (the broker removes the directory next): step
        down from the stream and stop following it first, so nothing writes into the
        directory while it goes."""
        service = self.service
        if incarnation in service.handles:
            service._step_down(incarnation, "stream deleted")
        followers = service.followers
        if followers is not None and followers.get(incarnation) is not None:
            await followers.stop(incarnation)

    async def _remove(self, incarnation: str) -> None:
        path = os.path.join(self.streams_dir, incarnation)
        if not os.path.isdir(path):
            return
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: shutil.rmtree(path, ignore_errors=True)
        )
        self.removed += 1
        self._unknown.discard(incarnation)
        log.info("cluster_deleted_stream_removed", incarnation=incarnation, path=path)
