"""Per-stream settings as the catalog stores them, with their user-facing bounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from tierlog.errors import ConfigError

MIB = 1 << 20
TIER_MODES = ("fragments", "segments")
READ_STRATEGIES = ("DISABLE", "NOT_IN_DISK", "NOT_IN_MEM", "FORCE")
SYNC_MODES = ("fsync", "os")
COMPRESSIONS = ("none", "zstd")
ENCRYPTIONS = ("none", "aes-256-gcm")


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Everything a stream can be configured with. ``None`` means "no limit".

    ``max_bytes`` / ``max_age_seconds`` are the whole stream's retention (both tiers);
    ``local_max_bytes`` / ``local_max_age_seconds`` only bound the local tier, which
    may never free data that is not yet durable remotely. ``sync`` is the stream's
    confirm point (``"fsync"`` or ``"os"``, see the server's ``log.sync``); ``None``
    follows the server.

    ``compression`` / ``compression_level`` / ``dictionary`` / ``encryption`` choose how
    fragments are stored from now on: any of them set makes the tierer write fragment
    format v2 (one zstd frame per chunk, a trained stream dictionary, AES-256-GCM sealing);
    fragments already written keep their format and stay readable.
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
    debounce_count: int = 5
    debounce_seconds: float = 2.0
    max_lag_bytes: int = 1 << 30
    read_strategy: str = "NOT_IN_DISK"
    manifest_fanout: int = 1024
    sync: str | None = None
    compression: str = "none"
    compression_level: int = 3
    dictionary: bool = False
    encryption: str = "none"

    @property
    def cold_coding(self) -> bool:
        """Whether fragments are written in format v2 (compressed and/or encrypted)."""
        return self.compression != "none" or self.encryption != "none"

    def __post_init__(self) -> None:
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
        if self.encryption not in ENCRYPTIONS:
            raise ConfigError(f"encryption must be one of {ENCRYPTIONS}, got {self.encryption!r}")

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
