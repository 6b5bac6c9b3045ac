"""The cluster's metrics (``metrics.cluster``), read at scrape time from the node's
cluster service, its ``ClusterNode`` and its replication hub.

Nothing here counts anything: the hub, its links and followed streams, the lease and
the leaders already keep every value; a scrape reads them. Counters kept per followed
stream are summed by the hub (``replica_counts``, which keeps the counts of streams it
stopped following, so the sums never go down), and a link's traffic is counted per
peer across reconnections (``hub.traffic``).

Per led stream only the worst member lag is exported; every other family is node-wide
or per peer node, so a scrape costs one pass over the led and followed streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.node import StreamLeader
from tierlog.cluster.state import Phase
from tierlog.metrics import Metrics
from tierlog.metrics.scraped import ScrapedSample

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

SILENT_HEARTBEATS = 2
"""A led stream lacks a majority once no majority of its voters was heard for this many
replication heartbeats (members fetch at least once per heartbeat)."""

Read = Callable[[], Iterable[ScrapedSample]]


def _one(value: Callable[[], float]) -> Read:
    return lambda: [((), float(value()))]


def watch_hub(
    metrics: Metrics,
    hub: Callable[[], ReplicationHub | None],
    peers: Callable[[], Iterable[str]] = lambda: (),
) -> None:
    """Read link, replica-side and buffer families from ``hub()`` (None: no replication,
    no samples). ``peers()``: nodes to report a link state for even before any link to
    them was opened."""
    families = metrics.cluster

    def from_hub(read: Callable[[ReplicationHub], Iterable[ScrapedSample]]) -> Read:
        def scrape() -> Iterable[ScrapedSample]:
            current = hub()
            return () if current is None else read(current)

        return scrape

    def node_value(value: Callable[[ReplicationHub], float]) -> Read:
        return from_hub(lambda h: [((), float(value(h)))])

    def per_peer(value: Callable[[ReplicationHub, str], float]) -> Read:
        def read(h: ReplicationHub) -> list[ScrapedSample]:
            return [((peer,), float(value(h, peer))) for peer in sorted(h.traffic)]

        return from_hub(read)

    def link_up(h: ReplicationHub) -> list[ScrapedSample]:
        known = set(h.traffic) | set(h.links) | set(peers())
        known.discard(h.node)
        up = {peer for peer, link in h.links.items() if not link.closed}
        return [((peer,), float(peer in up)) for peer in sorted(known)]

    families.streams_followed.read = node_value(lambda h: len(h.followed))
    families.link_up.read = from_hub(link_up)
    families.link_sent_bytes.read = per_peer(lambda h, p: h.traffic[p].bytes_sent)
    families.link_sent_frames.read = per_peer(lambda h, p: h.traffic[p].frames_sent)
    families.link_received_bytes.read = per_peer(lambda h, p: h.traffic[p].bytes_received)
    families.link_received_frames.read = per_peer(lambda h, p: h.traffic[p].frames_received)
    families.link_auth_failures.read = node_value(lambda h: h.auth_failures)
    families.link_malformed_frames.read = node_value(lambda h: h.malformed_frames)
    families.link_send_failures.read = node_value(lambda h: h.send_failures)
    families.link_refusals.read = from_hub(
        lambda h: [((reason,), float(count)) for reason, count in sorted(h.refusals.items())]
    )
    families.fetch_timeouts.read = node_value(lambda h: h.replica_counts().fetch_timeouts)
    families.tail_queries_answered.read = node_value(lambda h: h.tails.answered)
    families.tail_queries_unanswered.read = node_value(lambda h: h.tails.unanswered)
    families.offset_requests_answered.read = node_value(lambda h: h.offsets.answered)
    families.offset_requests_unanswered.read = node_value(lambda h: h.offsets.unanswered)
    families.fetch_refusals.read = node_value(lambda h: h.replica_counts().refusals)
    families.rejoins.read = node_value(lambda h: h.replica_counts().rejoins)
    families.refused_appends.read = node_value(lambda h: h.replica_counts().refused_appends)
    families.replica_buffered_bytes.read = node_value(lambda h: h.budget.used)
    families.replica_buffer_limit_bytes.read = node_value(lambda h: h.budget.limit)
    families.open_segment_files.read = node_value(lambda h: len(h.files))


def member_lag(leader: StreamLeader) -> int:
    """The leader's last written chunk id minus the lowest one any other member reported
    written in this epoch (0 when alone or when every member has everything)."""
    state = leader.state
    own = lowest = state.written(state.node)
    for group in (state.membership.voters, state.membership.learners):
        for member in group:
            if member != state.node:
                lowest = min(lowest, state.written(member))
    return max(0, own - lowest)


def without_majority(leader: StreamLeader, now: float, silence: float) -> bool:
    """Still electing, or no majority of voters heard for ``silence`` seconds."""
    state = leader.state
    if state.phase in (Phase.ADOPTING, Phase.CATCHING_UP):
        return True
    return now - state.quorum_contact(now) > silence


def watch_cluster(metrics: Metrics, service: ClusterService) -> None:
    """Every cluster family of ``metrics``, read from ``service`` (its hub is created
    when it starts, so it is looked up at each scrape)."""
    families = metrics.cluster
    watch_hub(metrics, lambda: service.hub, lambda: service.view.nodes)
    families.streams_led.read = _one(lambda: len(service.handles))
    families.streams_followed.read = _one(lambda: len(service.hub.followed) if service.hub else 0)
    families.live_nodes.read = _one(lambda: len(service.view.nodes))
    families.lease_held.read = _one(lambda: service.lease is not None and service.lease.held)
    families.lease_renewal_age_seconds.read = lambda: _lease_age(service)
    families.leaderships_acquired.read = _one(lambda: service.acquired)
    families.step_downs.read = _one(lambda: service.stepped_down)
    families.member_lag_offsets.read = lambda: _lags(service)
    families.streams_without_majority.read = _one(lambda: _without_majority(service))
    families.member_changes.read = _one(lambda: service.changes.changes)
    families.member_changes_waiting.read = _one(lambda: len(service.changes.waiting))
    families.node_retiring.read = _one(
        lambda: 2 if service.changes.retired else int(service.changes.retiring_here)
    )


def _lease_age(service: ClusterService) -> list[ScrapedSample]:
    lease = service.lease
    if lease is None or lease.renewed_at is None:
        return []
    return [((), max(0.0, lease.clock() - lease.renewed_at))]


def _led(service: ClusterService) -> Iterable[tuple[str, StreamLeader]]:
    for incarnation, leader in list(service.node.leaders.items()):
        if not leader.stepped_down:
            yield incarnation, leader


def _lags(service: ClusterService) -> list[ScrapedSample]:
    out: list[ScrapedSample] = []
    for incarnation, leader in _led(service):
        handle = service.handles.get(incarnation)
        if handle is not None:
            out.append(((handle.vhost, handle.name), float(member_lag(leader))))
    return out


def _without_majority(service: ClusterService) -> int:
    hub = service.hub
    heartbeat = hub.heartbeat if hub is not None else service.timing.ttl / 4
    silence = SILENT_HEARTBEATS * heartbeat
    now = service.node.clock()
    return sum(without_majority(leader, now, silence) for _, leader in _led(service))
