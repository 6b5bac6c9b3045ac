"""The soak's streams: one spec per stream, every kind the issue names, with small local
limits so that tiering, local retention and member catch-up run all the time."""

from __future__ import annotations

from dataclasses import dataclass

from tests.soak.profile import Profile

BASE_ARGS = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.2",
    "stream-max-segment-size-bytes": "32768",
    "x-tierlog-local-max-bytes": "1",
}
"""Local tiers hold the active segment and what is not tiered yet: disk use reaches its
steady state within a minute, so growth after that is a leak."""


def _arguments(extra: dict[str, str]) -> dict[str, str]:
    """A stream's arguments: the base ones and its own; a segment-offload stream has no
    local limit (it frees offloaded segments after its deletion lag, and refuses one)."""
    arguments = {**BASE_ARGS, **extra}
    if arguments.get("x-tierlog-tier-mode") == "segments":
        del arguments["x-tierlog-local-max-bytes"]
    return arguments


@dataclass(frozen=True)
class StreamSpec:
    name: str
    kind: str
    replicas: int
    arguments: dict[str, str]
    rate: float  # publish batches a second
    batch: int  # messages a batch (1: one message a frame, one chunk a message)
    retained: bool = False  # whole-stream retention: the start of the stream goes away
    delayed: bool = False
    body_bytes: int = 1000

    def body(self, i: int) -> bytes:
        """Message ``i``'s body: ``msg-%08d-`` and filler (the consumers parse the id)."""
        head = b"msg-%08d-" % i
        return head + bytes([i % 251]) * max(0, self.body_bytes - len(head))

    @property
    def create_arguments(self) -> dict[str, str]:
        return {**self.arguments, "x-initial-cluster-size": str(self.replicas)}


def build_streams(profile: Profile) -> list[StreamSpec]:
    """The profile's streams; rates cycle through one-message frames, small batches and
    large batches."""
    shapes = ((4.0, 1), (2.0, 10), (0.5, 100))  # (batches/s, messages/batch)
    out: list[StreamSpec] = []

    def add(kind: str, count: int, replicas: int, extra: dict[str, str], **flags: bool) -> None:
        for i in range(count):
            rate, batch = shapes[len(out) % len(shapes)]
            out.append(
                StreamSpec(
                    f"soak-{kind}-{i}",
                    kind,
                    replicas,
                    _arguments(extra),
                    rate * profile.rate_scale,
                    batch,
                    **flags,
                )
            )

    add("rf3", profile.rf3_plain, 3, {})
    add("rf1", profile.rf1_plain, 1, {})
    add(
        "dict",
        profile.dictionary,
        3,
        {"x-tierlog-compression": "zstd", "x-tierlog-dictionary": "true"},
    )
    add("enc", profile.encrypted, 3, {"x-tierlog-encryption": "aes-256-gcm"})
    add(
        "seg",
        profile.segments,
        1,
        {
            "x-tierlog-tier-mode": "segments",
            "x-tierlog-offload-threshold-bytes": "131072",
            "x-tierlog-offload-deletion-lag": "0",
        },
    )
    add("ackremote", profile.ack_remote, 3, {"x-tierlog-ack": "remote"})
    add("retained", profile.retained, 3, {"max-age": "60s"}, retained=True)
    add("delayed", profile.delayed, 3, {"x-tierlog-delayed": "true"}, delayed=True)
    return out
