"""The node's side of amnesia-safe membership: its stream directories' identities.

``cluster/disk_identity.py`` decides (pure); this module does the I/O around it for the
cluster service: reads a stream directory's identity (``log/member_id.py``), claims a
place (a fresh identity fsynced into the directory, then recorded with a conditional
put on the stream's record) or records a lost disk. The service asks ``admit`` before
it follows or takes over a stream, and passes ``claim_for`` to every leadership
acquisition, which re-checks the disk inside its transaction: a node whose directory
is not the one the record trusts neither adopts, acknowledges nor leads.

Once a stream is admitted its identity is remembered (no file read per scan); a
directory emptied under a running process is found at the next start.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tierlog.cluster.disk_identity import DiskSeen, Standing, standing
from tierlog.cluster.membership import ClusterDirectory, DiskClaim, StreamMembers
from tierlog.log.config import LogConfig
from tierlog.log.member_id import holds_chunks, new_member_id, read_member_id, write_member_id
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger

log = get_logger("tierlog.server.cluster")

RunBlocking = Callable[..., Awaitable[Any]]


class DiskTrust:
    """This node's standing in every stream it is a member of (see the module doc)."""

    def __init__(
        self, node: str, directory: ClusterDirectory, streams_dir: str, run: RunBlocking
    ) -> None:
        self.node = node
        self.directory = directory
        self.streams_dir = streams_dir
        self._run = run  # runs a blocking call off the event loop
        self._trusted: dict[str, str] = {}  # incarnation -> identity found trusted
        self._lost_at: dict[str, int] = {}  # incarnation -> record version found lost
        self.lost: set[str] = set()  # incarnations where this node's disk is lost

    def claim_for(self, incarnation: str, config: LogConfig | None = None) -> DiskClaim:
        """The stream directory as it is now, and how to give it a fresh identity
        (blocking: run it off the event loop). With ``config``, a directory that does
        not exist yet gets an empty follower log first, so it opens as any member's."""
        path = os.path.join(self.streams_dir, incarnation)
        seen = DiskSeen(read_member_id(path), holds_chunks(path))

        def take() -> str:
            if config is not None and not os.path.isdir(path):
                StreamLog.create_follower(path, config).close()
            member_id = new_member_id()
            write_member_id(path, member_id)
            log.info("cluster_member_disk_claimed", incarnation=incarnation, node=self.node)
            return member_id

        return DiskClaim(seen, take)

    def may_lead(self, record: StreamMembers) -> bool:
        """Whether this node's directory lets it lead the stream as ``record`` stands
        (trusted, or a place it may claim in the acquisition). Blocking (a file read)."""
        claim = self.claim_for(record.incarnation)
        now = standing(record.membership, record.disks, self.node, claim.seen)
        return now in (Standing.TRUSTED, Standing.CLAIM)

    async def admit(self, record: StreamMembers, config: LogConfig) -> bool:
        """Before following or taking over the stream: True when this node's directory
        is the one the record trusts, after claiming a place it may claim; a directory
        that is not is recorded as lost (logged once) and False is returned."""
        incarnation = record.incarnation
        expected = record.disks.id_of(self.node)
        if (
            expected
            and self._trusted.get(incarnation) == expected
            and self.node not in record.disks.lost
        ):
            return True
        if self._lost_at.get(incarnation) == record.version:
            return False  # found lost against this very record: nothing to read again
        claim: DiskClaim = await self._run(self.claim_for, incarnation, config)
        now = standing(record.membership, record.disks, self.node, claim.seen)
        if now in (Standing.CLAIM, Standing.MARK_LOST):
            now = await self._run(self.directory.settle_disk, incarnation, self.node, claim)
        if now is Standing.TRUSTED:
            self.lost.discard(incarnation)
            if claim.seen.disk_id:
                self._trusted[incarnation] = claim.seen.disk_id
            return True
        if now is Standing.LOST:
            self._lost_at[incarnation] = record.version
        if now is not Standing.NOT_MEMBER:
            self._lost(incarnation, now)
        return False

    def _lost(self, incarnation: str, now: Standing) -> None:
        self._trusted.pop(incarnation, None)
        if incarnation in self.lost:
            return
        self.lost.add(incarnation)
        log.warning(
            "cluster_member_disk_lost",
            incarnation=incarnation,
            node=self.node,
            standing=now.value,
            action="neither votes nor leads; waits to rejoin as a learner",
        )

    def keep(self, incarnations: Iterable[str]) -> None:
        """Forget streams no longer in the directory (deleted)."""
        live = set(incarnations)
        for known in (self._trusted, self._lost_at):
            for incarnation in [i for i in known if i not in live]:
                del known[incarnation]
        self.lost &= live

    def status(self) -> dict[str, Any]:
        return {"disks_lost": sorted(self.lost)}
