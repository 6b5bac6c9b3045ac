"""Who may take a stream no node has led yet.

Creating a replicated stream is two steps on the creating node: register the stream's
cluster record (its voters, epoch 0, no leader), then acquire it. Between the two, every
other voter's directory scan sees a leaderless stream it is a voter of; if one of them
took it, the creation failed (the creator's acquisition finds a live leader) and the
stream was deleted again. RabbitMQ's rule is that the creating node leads a new stream,
so the other voters leave a never-led stream alone for one lease TTL after they first see
it; a creator that died in between is replaced after that.
"""

from __future__ import annotations


class NeverLedStreams:
    """When this node first saw each never-led stream (pure: the caller passes the time)."""

    def __init__(self, ttl: float, max_entries: int = 100_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._first_seen: dict[str, float] = {}

    def may_take(self, incarnation: str, epoch: int, now: float) -> bool:
        """Whether a voter other than the creator may take the stream now (``epoch``:
        the cluster record's; 0 until a first leader acquired it)."""
        if epoch > 0:
            self._first_seen.pop(incarnation, None)
            return True
        if len(self._first_seen) >= self.max_entries:
            self._first_seen.clear()  # bounded: streams deleted before anyone led them
        first = self._first_seen.setdefault(incarnation, now)
        return now - first >= self.ttl

    def __len__(self) -> int:
        return len(self._first_seen)

    def forget(self, incarnation: str) -> None:
        self._first_seen.pop(incarnation, None)
