"""What the health routes answer: live, ready (and why not), degraded tiering.

``/api/health/live`` answers while the event loop runs (a liveness probe restarts a
server that stops answering); ``/api/health/ready`` answers 200 only when the listeners
are up, start-up has opened every stream and no stream's tiering is degraded, halted or
not started (a readiness probe takes the node out of a load balancer meanwhile), else
503 with the reasons. Both are served without credentials and name no stream; the
authenticated ``/api/health`` names the streams whose tiering is degraded.
"""

from __future__ import annotations

from collections.abc import Callable

from tierlog.server.broker import Broker

DegradedStreams = Callable[[], dict[tuple[str, str], str]]
"""(vhost, stream) → ``degraded``, ``halted`` or ``not started``."""


def no_degraded_streams() -> dict[tuple[str, str], str]:
    """Tiering off: nothing can be degraded."""
    return {}


class Health:
    """The server's health as the probes see it; ``listening`` is set by the server
    once every listener is bound."""

    def __init__(self, broker: Broker, degraded: DegradedStreams = no_degraded_streams) -> None:
        self.broker = broker
        self.degraded = degraded
        self.listening = False

    def not_ready(self) -> list[str]:
        """Why this node should not take traffic yet; empty when it is ready."""
        reasons = []
        if not self.listening:
            reasons.append("listeners not up")
        if not self.broker.all_open.is_set():
            opening = len(self.broker.opening_streams())
            reasons.append(f"opening streams ({opening} left)")
        degraded = self.degraded()
        if degraded:
            kinds = sorted(set(degraded.values()))
            reasons.append(f"tiering {'/'.join(kinds)} on {len(degraded)} stream(s)")
        return reasons
