"""What an operator sees of a stream's cluster state (``GET /api/streams/{name}``).

Every ``state`` word the stream API can return is declared here, once: ``STREAM_STATES``
for the stream itself and ``MEMBER_STATES`` for each member in its ``cluster`` section
(docs/cluster.md, "What an operator sees", lists the same words; a test compares them).

The section is assembled from what this node knows, and says so:

* the leader knows every member's written chunk (their ``WRITTEN`` reports in its
  epoch), when it last heard each, and the commit: it tells who follows, who catches up
  from how far, who is silent and whose node is down;
* a member knows its own replication from its replica runner (``ReplicaStatus``): its
  state, how far short of the announced commit it is, and its last failure ("failed:
  …"), and whether it serves consumers now (``server.member_reads``' bound);
* a node that is neither knows the members and their roles from the directory only
  (``unknown``: ask the leader's or the member's own API).

``member_state`` is the one decision, pure; ``cluster_status`` gathers its inputs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tierlog.cluster.log_history import NO_CHUNK

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

STREAM_STATES = (
    "available",
    "resolving",
    "unavailable",
    "failed",
    "following",
    "led-elsewhere",
    "read-only",
)
"""The stream's ``state``: on the node leading it (or a single node) ``available``,
``resolving`` (its first resolution runs), ``unavailable`` (appends refused, ``error``
says why) or ``failed`` (opening failed, ``error``); ``following`` on a member holding
a copy it replicates; ``led-elsewhere`` on a cluster node holding no copy it follows;
``read-only`` on a read-only node."""

MEMBER_STATES = (
    "leading",
    "following",
    "catching-up",
    "failed",
    "idle",
    "not-heard",
    "down",
    "unknown",
)
"""A member's ``state`` in the stream's ``cluster`` section (docs/cluster.md)."""


def member_state(
    *,
    live: bool,
    leads: bool,
    written: int | None,
    committed: int,
    heard_age: float | None,
    silence: float,
    replica_state: str | None = None,
    behind: int = 0,
    last_error: str | None = None,
) -> tuple[str, str | None]:
    """(state, why not following) of one member from what this node knows of it.

    ``written`` / ``heard_age`` come from the leader's view (None when this node does
    not lead); ``replica_state`` / ``behind`` / ``last_error`` from the member's own
    replica runner (None when this node is not that member)."""
    if leads:
        return "leading", None
    if replica_state is not None:  # the member's own account
        if replica_state == "failed":
            return "failed", f"failed: {last_error}"
        if replica_state == "catching-up":
            return "catching-up", f"catching up from {behind:,} offsets behind the commit"
        if replica_state == "idle":
            return "idle", "has heard no leader yet"
        return "following", None
    if not live:
        return "down", "its node holds no live lease (down, or cut from the MetaStore)"
    if written is None:
        return "unknown", "only the leader and the member itself know its progress"
    if heard_age is None or written == NO_CHUNK:
        return "not-heard", "has reported nothing in this epoch yet"
    if heard_age > silence:
        return "not-heard", f"not heard from for {heard_age:.1f} s"
    if written < committed:
        return "catching-up", f"catching up from {committed - written:,} offsets behind the commit"
    return "following", None


def cluster_status(service: ClusterService, status: dict[str, Any]) -> dict[str, Any]:
    """``status`` (a stream's as the broker or a handle gives it) with its ``cluster``
    section, and ``following`` as the state on a member replicating it."""
    incarnation = status.get("incarnation")
    place = service.view.streams.get(incarnation) if isinstance(incarnation, str) else None
    if place is None:
        return status
    assert isinstance(incarnation, str)
    record = place.record
    membership = record.membership
    leader = service.node.leaders.get(incarnation)
    leads_here = leader is not None and not leader.stepped_down
    hub = service.hub
    replica = hub.replica_status(incarnation) if hub is not None else None
    if replica is not None and status.get("state") == "led-elsewhere":
        status = {**status, "state": "following"}
    now = time.monotonic()
    members = []
    for node in membership.members:
        role = "voter" if membership.is_voter(node) else "learner"
        entry: dict[str, Any] = {"node": node, "role": role, "live": node in service.view.nodes}
        written: int | None = None
        heard_age: float | None = None
        committed = NO_CHUNK
        if leads_here and leader is not None:
            state = leader.state
            written = state.written(node)
            heard = state.heard_at(node)
            heard_age = None if heard is None else max(0.0, now - heard)
            committed = leader.committed
            entry["written_chunk_id"] = written
            entry["committed_chunk_id"] = committed
            entry["lag_offsets"] = max(0, state.written(service.name) - written)
        own = node == service.name and replica is not None
        if own:
            assert replica is not None
            entry["written_chunk_id"] = replica.written_chunk_id
            entry["committed_chunk_id"] = replica.commit_chunk_id
            entry["leader_commit_chunk_id"] = replica.leader_commit_chunk_id
            entry["lag_offsets"] = replica.behind
            refusal = service.member_refusal(incarnation)
            entry["serves_consumers"] = refusal is None
            entry["not_serving_because"] = refusal
        word, why = member_state(
            live=entry["live"],
            leads=(node == record.leader and place.leader is not None)
            or (leads_here and node == service.name),
            written=written,
            committed=committed,
            heard_age=heard_age,
            silence=service.timing.ttl,
            replica_state=replica.state if own and replica is not None else None,
            behind=replica.behind if own and replica is not None else 0,
            last_error=replica.last_error if own and replica is not None else None,
        )
        entry["state"] = word
        entry["why"] = why
        members.append(entry)
    section = {
        "leader": place.leader.name if place.leader is not None else None,
        "epoch": record.epoch,
        "this_node": service.name,
        "replication_factor": record.replication_factor or len(membership.voters),
        "members": members,
    }
    return {**status, "cluster": section}
