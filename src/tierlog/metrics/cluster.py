"""The cluster's metric families: replication, leases and leadership of one node.

All are read at scrape time from the node's cluster service and replication hub
(``server.cluster_metrics`` sets their ``read``). They are node-wide, or per peer node
for links; the one per-stream family is the worst member lag of each stream this node
leads, so 10,000 streams do not make 10,000 x members series.
"""

from __future__ import annotations

from typing import Literal, Protocol

from tierlog.metrics.scraped import STREAM_LABELS, Scraped


class Declare(Protocol):
    """``Metrics._scrape``: declares one family on the registry."""

    def __call__(
        self,
        name: str,
        documentation: str,
        kind: Literal["gauge", "counter"],
        labels: tuple[str, ...] = (),
    ) -> Scraped: ...


class ClusterFamilies:
    """The cluster families of one ``Metrics`` (``metrics.cluster``)."""

    def __init__(self, scrape: Declare) -> None:
        self.streams_led = scrape(
            "tierlog_cluster_streams_led", "Streams this node leads (open here).", "gauge"
        )
        self.streams_followed = scrape(
            "tierlog_cluster_streams_followed", "Streams this node replicates as a member.", "gauge"
        )
        self.live_nodes = scrape(
            "tierlog_cluster_live_nodes",
            "Nodes with a live lease in the last directory scan (this one included).",
            "gauge",
        )
        self.lease_held = scrape(
            "tierlog_cluster_lease_held", "1 while this node holds its node lease.", "gauge"
        )
        self.lease_renewal_age_seconds = scrape(
            "tierlog_cluster_lease_renewal_age_seconds",
            "Seconds since the node lease was last renewed or taken (sent time).",
            "gauge",
        )
        self.leaderships_acquired = scrape(
            "tierlog_cluster_leaderships_acquired", "Stream leaderships this node took.", "counter"
        )
        self.step_downs = scrape(
            "tierlog_cluster_step_downs", "Stream leaderships this node gave up.", "counter"
        )
        peer = ("peer",)
        self.link_up = scrape(
            "tierlog_cluster_link_up",
            "1 while an authenticated replication link to the peer node is open.",
            "gauge",
            peer,
        )
        self.link_sent_bytes = scrape(
            "tierlog_cluster_link_sent_bytes", "Bytes sent to the peer node.", "counter", peer
        )
        self.link_sent_frames = scrape(
            "tierlog_cluster_link_sent_frames", "Frames sent to the peer node.", "counter", peer
        )
        self.link_received_bytes = scrape(
            "tierlog_cluster_link_received_bytes",
            "Bytes received from the peer node.",
            "counter",
            peer,
        )
        self.link_received_frames = scrape(
            "tierlog_cluster_link_received_frames",
            "Frames received from the peer node.",
            "counter",
            peer,
        )
        self.link_auth_failures = scrape(
            "tierlog_cluster_link_auth_failures",
            "Replication links refused because a side failed to prove the cluster secret.",
            "counter",
        )
        self.link_malformed_frames = scrape(
            "tierlog_cluster_link_malformed_frames",
            "Replication links closed for a malformed frame.",
            "counter",
        )
        self.link_refusals = scrape(
            "tierlog_cluster_link_refusals",
            "Incoming replication connections refused, by reason (connection_cap, auth,"
            " oversized, malformed, timeout, closed).",
            "counter",
            ("reason",),
        )
        self.link_send_failures = scrape(
            "tierlog_cluster_link_send_failures",
            "Replication links closed because a write failed.",
            "counter",
        )
        self.fetch_timeouts = scrape(
            "tierlog_cluster_fetch_timeouts",
            "Fetches sent again by this node's members for want of an answer.",
            "counter",
        )
        self.tail_queries_answered = scrape(
            "tierlog_cluster_tail_queries_answered",
            "Committed-tail queries of other nodes this node answered as a stream's leader.",
            "counter",
        )
        self.tail_queries_unanswered = scrape(
            "tierlog_cluster_tail_queries_unanswered",
            "Committed-tail queries of this node no leader answered in time (remote fallback).",
            "counter",
        )
        self.offset_requests_answered = scrape(
            "tierlog_cluster_offset_requests_answered",
            "Consumer offsets other nodes forwarded that this node answered as a stream's leader.",
            "counter",
        )
        self.offset_requests_unanswered = scrape(
            "tierlog_cluster_offset_requests_unanswered",
            "Consumer offsets this node forwarded that no leader answered in time (MetaStore).",
            "counter",
        )
        self.fetch_refusals = scrape(
            "tierlog_cluster_fetch_refusals",
            "Fetches of this node's members that their leader refused.",
            "counter",
        )
        self.rejoins = scrape(
            "tierlog_cluster_rejoins",
            "Member copies dropped and fetched again: the leader's retention passed them.",
            "counter",
        )
        self.refused_appends = scrape(
            "tierlog_cluster_refused_appends",
            "Chunks from a leader that this node's members refused to append.",
            "counter",
        )
        self.replica_buffered_bytes = scrape(
            "tierlog_cluster_replica_buffered_bytes",
            "Chunk bytes received from leaders and not yet written.",
            "gauge",
        )
        self.replica_buffer_limit_bytes = scrape(
            "tierlog_cluster_replica_buffer_limit_bytes",
            "Limit of those bytes: over it, links stop reading.",
            "gauge",
        )
        self.open_segment_files = scrape(
            "tierlog_cluster_open_segment_files",
            "Segment files held open to serve members' fetches.",
            "gauge",
        )
        self.member_lag_offsets = scrape(
            "tierlog_cluster_member_lag_offsets",
            "Led stream: the leader's last written chunk id minus the lowest one a member "
            "reported written in this epoch (0: every member has everything).",
            "gauge",
            STREAM_LABELS,
        )
        self.streams_without_majority = scrape(
            "tierlog_cluster_streams_without_majority",
            "Led streams whose leader has not heard a majority of voters lately (or is "
            "still electing).",
            "gauge",
        )
        self.member_changes = scrape(
            "tierlog_cluster_member_changes",
            "Members this node added to or removed from streams it leads.",
            "counter",
        )
        self.member_changes_waiting = scrape(
            "tierlog_cluster_member_changes_waiting",
            "Led streams whose next member change waits (a learner catching up, no spare "
            "node, staying voters catching up).",
            "gauge",
        )
        self.node_retiring = scrape(
            "tierlog_cluster_node_retiring",
            "1 while this node is being retired, 2 once it has retired.",
            "gauge",
        )
