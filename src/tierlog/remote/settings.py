"""Per-stream settings as the catalog stores them, with their user-facing bounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from tierlog.errors import ConfigError
from tierlog.formats.bloom import DEFAULT_FILTER_SIZE, check_filter_size
from tierlog.remote.errors import AckModeError

MIB = 1 << 20
TIER_MODES = ("fragments", "segments")
DEFAULT_OFFLOAD_DELETION_LAG_SECONDS = 4 * 3600.0
READ_STRATEGIES = ("DISABLE", "NOT_IN_DISK", "NOT_IN_MEM", "FORCE")
SYNC_MODES = ("fsync", "os")
COMPRESSIONS = ("none", "zstd")
INDEX_KEYS = ("message-id", "correlation-id", "subject")
INDEX_KEY_PROPERTY = "property:"


def check_index_key(value: object) -> str:
    """A record key for the key index: an AMQP property (``message-id``, ``correlation-id``,
    ``subject``) or ``property:<name>`` (an application property)."""
    if isinstance(value, str) and (
        value in INDEX_KEYS
        or (value.startswith(INDEX_KEY_PROPERTY) and len(value) > len(INDEX_KEY_PROPERTY))
    ):
        return value
    raise ConfigError(f"index_key must be one of {INDEX_KEYS} or 'property:<name>', got {value!r}")


ENCRYPTIONS = ("none", "aes-256-gcm")
ACK_MODES = ("replicas", "remote")


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Everything a stream can be configured with. ``None`` means "no limit".

    ``max_bytes`` / ``max_age_seconds`` are the whole stream's retention (both tiers);
    ``local_max_bytes`` / ``local_max_age_seconds`` only bound the local tier, which
    may never free data that is not yet durable remotely. ``sync`` is the stream's
    confirm point (``"fsync"`` or ``"os"``, see the server's ``log.sync``); ``None``
    follows the server.

    ``ack`` says when a publish is confirmed (fixed at creation): ``"replicas"`` once
    its chunk is committed locally (fsynced here, and on a majority of the stream's
    members in a cluster), ``"remote"`` once its chunk is in a committed manifest of the
    remote tier (fragments cut and committed every ``tier.remote_ack_interval_seconds``;
    consumers read only below the remote-committed offset). ``remote`` needs ``tier_mode
    = fragments``.

    ``tier_mode`` is fixed at creation. In ``segments`` mode sealed segments are offloaded
    whole once the local bytes not offloaded exceed ``offload_threshold_bytes`` or once a
    segment has been sealed ``offload_threshold_age_seconds`` (each lower than the matching
    retention limit), in blocks of ``offload_block_size``; a local copy goes
    ``offload_deletion_lag_seconds`` after its offload was committed.

    ``compression`` / ``compression_level`` / ``dictionary`` / ``encryption`` choose how
    fragments are stored from now on: any of them set makes the tierer write fragment
    format v2 (one zstd frame per chunk, a trained stream dictionary, AES-256-GCM sealing);
    fragments already written keep their format and stay readable. Compression and
    dictionaries apply to ``fragments`` mode only (a ``segments`` stream setting one is
    refused); ``encryption`` applies to both: a ``segments`` stream offloads its segments
    sealed (offload format 2) from then on.

    ``index_key`` is the record key the key index is built on: ``message-id`` (default),
    ``correlation-id``, ``subject`` or ``property:<name>``; each index window records the
    key it was built with, so changing it affects new windows only.

    ``delayed`` (fixed at creation) turns on delayed delivery (docs/delayed.md): only such
    a stream parses ``x-delay`` / ``x-deliver-at``; ``delayed_horizon_seconds`` is how far
    ahead its scheduler keeps messages in the local working set.
    """

    max_bytes: int | None = None
    max_age_seconds: float | None = None
    local_max_bytes: int | None = None
    local_max_age_seconds: float | None = None
    max_segment_bytes: int = 500_000_000
    max_segment_chunks: int = 256_000
    tier_mode: str = "fragments"
    fragment_bytes: int = 64 * MIB
    max_fragment_age_seconds: float = 60.0
    debounce_count: int = 8
    debounce_seconds: float = 2.0
    max_lag_bytes: int = 1 << 30
    read_strategy: str = "NOT_IN_DISK"
    manifest_fanout: int = 1024
    offload_threshold_bytes: int | None = None
    offload_threshold_age_seconds: float | None = None
    offload_deletion_lag_seconds: float = DEFAULT_OFFLOAD_DELETION_LAG_SECONDS
    offload_block_size: int = 64 * MIB
    sync: str | None = None
    compression: str = "none"
    compression_level: int = 3
    dictionary: bool = False
    encryption: str = "none"
    index_key: str = "message-id"
    delayed: bool = False
    delayed_horizon_seconds: float = 3600.0
    ack: str = "replicas"
    filter_size: int = DEFAULT_FILTER_SIZE

    @property
    def cold_coding(self) -> bool:
        """Whether fragments are written in format v2 (compressed and/or encrypted)."""
        return self.compression != "none" or self.encryption != "none"

    def __post_init__(self) -> None:
        self._check_offload()
        for name in ("max_bytes", "local_max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(f"{name} must be a positive integer or unset, got {value!r}")
        for name in ("max_age_seconds", "local_max_age_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive or unset, got {value!r}")
        if not MIB <= self.fragment_bytes <= 1024 * MIB:
            raise ConfigError(
                f"fragment_bytes must be between 1 MiB and 1 GiB, got {self.fragment_bytes}"
            )
        if self.tier_mode not in TIER_MODES:
            raise ConfigError(f"tier_mode must be one of {TIER_MODES}, got {self.tier_mode!r}")
        if self.read_strategy not in READ_STRATEGIES:
            raise ConfigError(
                f"read_strategy must be one of {READ_STRATEGIES}, got {self.read_strategy!r}"
            )
        if self.sync is not None and self.sync not in SYNC_MODES:
            raise ConfigError(f"sync must be one of {SYNC_MODES} or unset, got {self.sync!r}")
        if self.max_segment_bytes < 4096 or self.max_segment_chunks < 1:
            raise ConfigError("max_segment_bytes must be >= 4096 and max_segment_chunks >= 1")
        if self.manifest_fanout < 2:
            raise ConfigError("manifest_fanout must be >= 2")
        try:
            check_filter_size(self.filter_size)
        except ValueError as exc:  # stream-filter-size-bytes, as RabbitMQ validates it
            raise ConfigError(f"stream-filter-size-bytes: {exc}") from None
        if self.max_lag_bytes < self.fragment_bytes:
            raise ConfigError("max_lag_bytes must be at least fragment_bytes")
        if self.max_fragment_age_seconds <= 0 or self.debounce_seconds < 0:
            raise ConfigError("max_fragment_age_seconds must be > 0 and debounce_seconds >= 0")
        if self.debounce_count < 1:
            raise ConfigError("debounce_count must be >= 1")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression must be one of {COMPRESSIONS}, got {self.compression!r}"
            )
        if not isinstance(self.compression_level, int) or not 1 <= self.compression_level <= 22:
            raise ConfigError(f"compression_level must be 1..22, got {self.compression_level!r}")
        if not isinstance(self.dictionary, bool):
            raise ConfigError(f"dictionary must be true or false, got {self.dictionary!r}")
        if self.dictionary and self.compression != "zstd":
            raise ConfigError("dictionary needs compression zstd")
        if self.ack not in ACK_MODES:
            raise ConfigError(f"ack must be one of {ACK_MODES}, got {self.ack!r}")
        if self.ack == "remote" and self.tier_mode != "fragments":
            raise AckModeError(
                "ack 'remote' needs tier_mode 'fragments': offloaded segments reach the "
                "remote tier only once sealed, so a confirm would wait for a whole segment"
            )
        if self.encryption not in ENCRYPTIONS:
            raise ConfigError(f"encryption must be one of {ENCRYPTIONS}, got {self.encryption!r}")
        check_index_key(self.index_key)
        if self.tier_mode == "segments" and self.index_key != "message-id":
            raise ConfigError("index_key applies to tier_mode 'fragments' only (key index)")
        if not isinstance(self.delayed, bool):
            raise ConfigError(f"delayed must be true or false, got {self.delayed!r}")
        if not 1.0 <= self.delayed_horizon_seconds <= 7 * 86400.0:
            raise ConfigError(
                "delayed_horizon_seconds must be within 1 s .. 7 days, got "
                f"{self.delayed_horizon_seconds!r}"
            )
        if self.tier_mode == "segments" and (
            self.compression != "none" or self.dictionary or self.compression_level != 3
        ):
            # offloaded segments hold the local segment files' chunks as written (sealed
            # when the stream is encrypted): a compression setting would do nothing
            raise ConfigError(
                "compression, compression_level and dictionary apply to tier_mode "
                "'fragments' only (offloaded segments store chunks as written)"
            )

    def _check_offload(self) -> None:
        """The seed's rule: a threshold is only useful below the retention limit it races."""
        size, age = self.offload_threshold_bytes, self.offload_threshold_age_seconds
        if size is not None and (not isinstance(size, int) or size < 0):
            raise ConfigError(f"offload_threshold_bytes must be an integer >= 0, got {size!r}")
        if age is not None and age < 0:
            raise ConfigError(f"offload_threshold_age_seconds must be >= 0, got {age!r}")
        if size is not None and self.max_bytes is not None and size >= self.max_bytes:
            raise ConfigError(
                f"offload_threshold_bytes ({size}) must be lower than the retention limit "
                f"max_bytes ({self.max_bytes}): data would be deleted before it is offloaded"
            )
        if age is not None and self.max_age_seconds is not None and age >= self.max_age_seconds:
            raise ConfigError(
                f"offload_threshold_age_seconds ({age}) must be lower than the retention limit "
                f"max_age_seconds ({self.max_age_seconds}): data would be deleted before it "
                "is offloaded"
            )
        if self.offload_deletion_lag_seconds < 0:
            raise ConfigError("offload_deletion_lag_seconds must be >= 0")
        if not 5 * MIB <= self.offload_block_size <= 5 * 1024 * MIB:
            raise ConfigError(
                f"offload_block_size must be between 5 MiB and 5 GiB, got {self.offload_block_size}"
            )
        if self.tier_mode != "segments" and (
            size is not None
            or age is not None
            or self.offload_deletion_lag_seconds != DEFAULT_OFFLOAD_DELETION_LAG_SECONDS
            or self.offload_block_size != 64 * MIB
        ):
            raise ConfigError(
                "offload settings apply to tier_mode 'segments' only (this stream tiers "
                f"in {self.tier_mode!r})"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown stream settings: {sorted(unknown)}")
        return cls(**data)

    def updated(self, **changes: Any) -> StreamSettings:
        return self.from_dict({**self.to_dict(), **changes})


def check_new_settings(settings: StreamSettings) -> None:
    """Rules for the settings a stream is created or changed with (not for entries already
    stored, which must keep opening). ``local_max_bytes`` / ``local_max_age_seconds`` bound
    the local tier of fragment-tiered streams; a ``segments`` stream frees each offloaded
    segment after ``offload_deletion_lag_seconds`` and applies no local limit, so the
    setting would be accepted and do nothing."""
    if settings.tier_mode == "segments" and (
        settings.local_max_bytes is not None or settings.local_max_age_seconds is not None
    ):
        raise ConfigError(
            "local_max_bytes and local_max_age_seconds apply to tier_mode 'fragments' only: "
            "a 'segments' stream frees offloaded segments after offload_deletion_lag_seconds"
        )


def check_tier_mode_unchanged(current: StreamSettings, changes: dict[str, Any]) -> None:
    """ConfigError when ``changes`` would change the tier mode: it is fixed at creation
    (the remote tier of a stream holds fragments or whole segments, never both)."""
    mode = changes.get("tier_mode", current.tier_mode)
    if mode != current.tier_mode:
        raise ConfigError(
            f"tier_mode is fixed at creation ({current.tier_mode!r}); it cannot become "
            f"{mode!r}: create a new stream instead"
        )
    if changes.get("delayed", current.delayed) != current.delayed:
        raise ConfigError("delayed is fixed at creation: create a new stream instead")
    ack = changes.get("ack", current.ack)
    if ack != current.ack:
        raise ConfigError(
            f"ack is fixed at creation ({current.ack!r}); it cannot become {ack!r}: "
            "create a new stream instead"
        )
