"""What one soak run does: its length, seed, load, the fault kinds it draws from and its
bounds. ``ci_profile()`` is the bounded run of the test suite; ``scripts/soak.py`` builds
longer ones from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

FAULT_KINDS = (
    "kill-leader",  # SIGKILL of an RF-3 stream's leader node, restarted after a take-over
    "pause-leader",  # SIGSTOP of a leader node past its lease, then SIGCONT
    "disk-full",  # a member's tmpfs filled with a filler file for a while, then freed
    "wipe-member",  # a node's data directory wiped before it restarts (no RF-1 stream on it)
    "cut-replication",  # one node's replication links cut both ways past the lease
    "cut-etcd",  # one node cut from etcd past its lease
    "s3-errors",  # the S3 fault proxy fails ~10 % of requests for the whole run
    "s3-outage",  # a burst of every S3 request failing
    "retire-node",  # a node retired, the retirement withdrawn, the node restarted
    "churn",  # a stream created, written, read back and deleted
)
"""Every fault kind; ``s3-errors`` is a background condition, the others are drawn from
the seeded schedule in shuffled rounds."""

BACKGROUND_FAULTS = ("s3-errors",)


@dataclass
class Profile:
    minutes: float
    seed: int = 7
    faults: tuple[str, ...] = FAULT_KINDS
    rf3_plain: int = 2  # streams of each kind (RF 3 unless said)
    rf1_plain: int = 2
    dictionary: int = 1  # fragment v2: zstd with a trained dictionary
    encrypted: int = 1
    segments: int = 1  # x-tierlog-tier-mode=segments (RF 1)
    ack_remote: int = 1
    retained: int = 1  # short whole-stream retention (max-age)
    delayed: int = 1
    rate_scale: float = 1.0  # multiplies every producer's rate
    mount_mb: int = 160  # each node's tmpfs data directory
    warmup_fraction: float = 0.2  # resource samples before this share of the run are skipped
    max_growth: float = 1.2  # last ÷ first quarter (median) of each resource
    catchup_bound_s: float = 90.0  # after each fault heals, every member catches up in this
    fault_gap_s: tuple[float, float] = (3.0, 8.0)  # quiet time between two faults
    hold_s: tuple[float, float] = (5.0, 10.0)  # how long a disk stays full (an outage: +2)
    orphan_grace_s: float = 125.0  # objects younger are not orphans (yet); the nodes'
    # gc_grace_seconds too (it must exceed 2 x store.task_stall_seconds = 120)
    orphan_poll_s: float = 30.0  # after the grace, orphans are polled for this long more
    spark: str = "batch"  # "batch" (read at the end), "streaming" (a query all along), "off"
    consumer_restart_s: float = 20.0  # consumers close and resume at their stored offset
    s3_error_rate: float = 0.10
    every_kind_once: bool = False  # keep drawing faults past the end until each kind ran
    retire_wait_s: float = 180.0  # a retirement (and the return) must complete in this
    drain_s: float = 90.0  # at the end, consumers get this long to read what was confirmed
    read_timeout_s: float = 180.0  # each final whole-stream read
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def stream_count(self) -> int:
        return (
            self.rf3_plain
            + self.rf1_plain
            + self.dictionary
            + self.encrypted
            + self.segments
            + self.ack_remote
            + self.retained
            + self.delayed
        )


def ci_profile(seed: int = 7, faults: tuple[str, ...] = FAULT_KINDS) -> Profile:
    """About three minutes: one stream of each kind, light rates (two shared cores), every
    enabled fault kind once (the run goes on past its 90 s until each ran), shorter holds
    and gaps between faults, a short batch Spark read at the end."""
    return Profile(
        minutes=1.5,
        seed=seed,
        faults=faults,
        rf3_plain=1,
        rf1_plain=1,
        rate_scale=0.5,
        mount_mb=128,
        catchup_bound_s=60.0,
        fault_gap_s=(0.5, 1.5),
        hold_s=(3.0, 6.0),
        orphan_poll_s=10.0,
        spark="batch",
        consumer_restart_s=15.0,
        every_kind_once=True,
        retire_wait_s=90.0,
        drain_s=40.0,
        read_timeout_s=60.0,
    )


def long_profile(minutes: float, seed: int, faults: tuple[str, ...] = FAULT_KINDS) -> Profile:
    """The long run: about twenty streams, the Spark streaming query, faults every few
    seconds to a minute."""
    return Profile(
        minutes=minutes,
        seed=seed,
        faults=faults,
        rf3_plain=5,
        rf1_plain=4,
        dictionary=2,
        encrypted=2,
        segments=1,
        ack_remote=2,
        retained=2,
        delayed=2,
        rate_scale=0.5,
        spark="streaming",
        fault_gap_s=(5.0, 30.0),
    )


def parse_faults(only: str | None, excluded: list[str]) -> tuple[str, ...]:
    """``--faults a,b`` (default: every kind) minus every ``--no-fault`` kind; an unknown
    name is an error naming the known ones."""
    chosen = FAULT_KINDS if not only else tuple(k.strip() for k in only.split(",") if k.strip())
    dropped = {k.strip() for item in excluded for k in item.split(",") if k.strip()}
    unknown = (set(chosen) | dropped) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULT_KINDS)}")
    return tuple(k for k in chosen if k not in dropped)
