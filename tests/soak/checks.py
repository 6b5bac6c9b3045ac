"""The soak's oracle, apart from what producers and consumers check as they go:

* ``measure_catchup``: after a fault heals, every member of every RF-3 stream holds the
  leader's committed offset of that moment, within the profile's bound;
* ``tally``: every confirmed message read back exactly once and in order through every
  node (delayed streams: exactly once and never before its due time);
* ``scan_logs``: each ERROR line is named by the fault whose window it fell in, or it is
  unexplained; the stall watchdog's reports are failures;
* ``orphans``: what the bucket holds that no manifest references (``tierlog spark gc``'s
  reference walk, dry run) once the grace period passed and the nodes' own garbage
  collection (``tier.gc_grace_seconds`` = the same grace) ran past it."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

from tests.cluster.nodes import Cluster, admin_json
from tests.soak.consumers import Delivery
from tests.soak.producers import SoakProducer
from tests.soak.streams import StreamSpec
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import iter_index_records
from tierlog.remote.catalog import Catalog
from tierlog.spark.jobs.common import RemoteTier
from tierlog.spark.jobs.gc import GcTask, discover_incarnations, gc_incarnation
from tierlog.storage.errors import NotFoundError

STALL_EVENTS = ("tiering_task_stalled",)
ERROR_SLACK_S = 30.0  # an error this long after a fault healed is still its consequence
S3_ERROR = re.compile(r"object.?store|S3|s3_|HTTP|SlowDown|InternalError|onnection|Transient")
"""An ERROR line the background S3 faults can explain names the store or its failure."""


def _leader_committed(cluster: Cluster, node: str, stream: str) -> int | None:
    """The leader's committed chunk id (its admin API)."""
    try:
        status = admin_json(cluster.node(node), f"/api/streams/{stream}")
        return int(status["local"]["committed_chunk_id"])
    except Exception:
        return None


def member_last_chunk(cluster: Cluster, node: str, stream: str) -> int | None:
    """The id of the last chunk a member holds, from its newest index file (a member's
    admin status shows no log of its own)."""
    try:
        directory = cluster.node(node).process.data_dir / "streams" / cluster.incarnation(stream)
        indexes = sorted(directory.glob("*.index"))
        for index in reversed(indexes):
            records = list(iter_index_records(index.read_bytes()))
            if records:
                return records[-1].chunk_id
    except (OSError, ValueError, FormatError):
        return None
    return None


async def measure_catchup(
    cluster: Cluster, specs: list[StreamSpec], bound: float
) -> tuple[float | None, list[str]]:
    """Seconds until every member of every RF-3 stream held the chunk its leader had
    committed last when this was called (None, and what is still behind, when ``bound``
    passed first)."""
    started = time.monotonic()
    targets: dict[str, int] = {}
    behind: list[str] = []
    while True:
        behind = []
        for spec in specs:
            if spec.replicas < 3:
                continue
            try:
                leader, _ = cluster.leader_of(spec.name)
                members = cluster.members_of(spec.name)
            except Exception as exc:
                behind.append(f"{spec.name}: directory {exc!r}")
                continue
            if leader is None:
                behind.append(f"{spec.name}: no leader")
                continue
            if spec.name not in targets:
                target = await asyncio.to_thread(_leader_committed, cluster, leader, spec.name)
                if target is None:
                    behind.append(f"{spec.name}: leader {leader} does not answer")
                    continue
                targets[spec.name] = target
            for member in members:
                if member == leader:
                    continue
                have = await asyncio.to_thread(member_last_chunk, cluster, member, spec.name)
                if have is None or have < targets[spec.name]:
                    behind.append(f"{spec.name} on {member}: chunk {have} < {targets[spec.name]}")
        elapsed = time.monotonic() - started
        if not behind:
            return elapsed, []
        if elapsed > bound:
            return None, behind
        await asyncio.sleep(1.0)


@dataclass
class Tally:
    confirmed: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    delayed_early: int = 0
    delayed_lost: int = 0
    retention_dropped: int = 0  # confirmed ids before a retained stream's first one
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in (
            "confirmed",
            "lost",
            "duplicated",
            "out_of_order",
            "delayed_early",
            "delayed_lost",
            "retention_dropped",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems += other.problems


def tally(spec: StreamSpec, producer: SoakProducer, reads: dict[str, list[Delivery]]) -> Tally:
    """One stream's messages as read through each reader (``reads``: reader name -> its
    deliveries, in order)."""
    out = Tally(confirmed=len(producer.confirmed))
    lost: set[int] = set()
    for reader, got in reads.items():
        ids = [d.id for d in got]
        counts = Counter(ids)
        dups = sum(c - 1 for c in counts.values())
        inversions = 0 if spec.delayed else sum(1 for a, b in pairwise(ids) if b < a)
        floor = min(ids) if spec.retained and ids else 1
        if spec.retained:
            out.retention_dropped = max(
                out.retention_dropped, sum(1 for i in producer.confirmed if i < floor)
            )
        # a reader that can only see a prefix (a non-member of a segment-mode stream)
        top = max(ids, default=0) if "offloaded part" in reader else float("inf")
        missing = {i for i in producer.confirmed if floor <= i <= top} - set(counts)
        if spec.delayed:
            out.delayed_lost = max(out.delayed_lost, len(missing))
            early = [
                (d.id, producer.due_ms[d.id] - d.timestamp_ms)
                for d in got
                if d.id in producer.due_ms and d.timestamp_ms < producer.due_ms[d.id]
            ]
            out.delayed_early = max(out.delayed_early, len(early))
            if early:
                out.problems.append(f"{spec.name} via {reader}: early (id, ms) {early[:3]}")
        else:
            lost |= missing
        out.duplicated = max(out.duplicated, dups)
        out.out_of_order = max(out.out_of_order, inversions)
        if missing or dups or inversions:
            out.problems.append(
                f"{spec.name} via {reader}: {len(got)} read, {len(missing)} confirmed missing"
                f" (first {sorted(missing)[:3]}), {dups} twice, {inversions} out of order"
            )
    out.lost = len(lost)
    return out


def consumer_gaps(spec: StreamSpec, producer: SoakProducer, got: list[Delivery]) -> int:
    """Confirmed ids a live consumer skipped inside the range it read."""
    if not got or spec.delayed:
        return 0
    ids = {d.id for d in got}
    low, high = min(ids), max(ids)
    return sum(1 for i in producer.confirmed if low <= i <= high and i not in ids)


@dataclass
class Window:
    kind: str
    start: float
    end: float


@dataclass
class LogScan:
    explained: Counter[tuple[str, str]] = field(default_factory=Counter)  # (event, cause)
    unexplained: list[str] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)


_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def scan_logs(cluster: Cluster, windows: list[Window], started: float) -> LogScan:
    out = LogScan()
    for name, node in cluster.nodes.items():
        try:
            text = node.process.log_path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if "level=error" not in line and "level=critical" not in line:
                if any(f"event={e}" in line for e in STALL_EVENTS):
                    out.stalls.append(f"{name}: {line[:300]}")
                continue
            fields = dict(_FIELD.findall(line))
            event = fields.get("event", "?")
            if event in STALL_EVENTS:
                out.stalls.append(f"{name}: {line[:300]}")
                continue
            try:
                at = datetime.fromisoformat(fields["ts"].replace("Z", "+00:00")).timestamp()
            except (KeyError, ValueError):
                at = 0.0
            causes = [
                w.kind
                for w in windows
                if w.start - 1.0 <= at <= w.end + ERROR_SLACK_S
                and (w.kind != "s3-errors" or S3_ERROR.search(line))
            ]
            if at < started:
                causes = ["start-up"]
            if causes:
                out.explained[(event, causes[-1])] += 1
            else:
                out.unexplained.append(f"{name}: {line[:400]}")
    return out


def by_event(lines: list[str]) -> dict[str, list[str]]:
    """Log lines grouped by their ``event``."""
    out: dict[str, list[str]] = {}
    for line in lines:
        found = re.search(r"event=(\S+)", line)
        out.setdefault(found.group(1) if found else "?", []).append(line)
    return out


def orphans(
    cluster: Cluster, object_uri: str, grace: float
) -> tuple[list[tuple[str, float]], list[str]]:
    """Objects of the bucket older than ``grace`` that no live manifest references and
    no deletion is pending for (gc's dry run, every incarnation), each with the time it
    was written; and what gc could not check (a manifest it could not read)."""
    tier = RemoteTier.create(object_uri, cluster.meta_uri)
    with tier.open_store() as store:
        found = discover_incarnations(store, tier.streams_root)
        live = {r.incarnation for r in Catalog(cluster.meta).list()}
        garbage: list[tuple[str, float]] = []
        doubts: list[str] = []
        now = time.time()
        for incarnation in sorted(set(found) | live):
            task = GcTask(incarnation, incarnation in live, grace, now, False)
            result = gc_incarnation(tier, task)
            for key in result.garbage:
                try:
                    written = store.head(key).last_modified
                except NotFoundError:
                    continue  # deleted since the walk: not left behind
                garbage.append((key, written or 0.0))
            if result.skipped_reason and incarnation in live:
                doubts.append(f"{incarnation}: {result.skipped_reason} {result.problems[:2]}")
    return garbage, doubts
