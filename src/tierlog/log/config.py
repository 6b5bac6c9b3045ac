"""Configuration of one local stream log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.formats.bloom import DEFAULT_FILTER_SIZE, check_filter_size
from tierlog.formats.chunk import MAX_SIMPLE_ENTRY_BYTES, SUB_BATCH_HEADER_SIZE
from tierlog.formats.segment import MAX_FILE_POSITION

FsyncPolicy = Literal["chunk", "interval", "never"]
SyncMode = Literal["fsync", "os"]
SYNC_MODES: tuple[SyncMode, ...] = ("fsync", "os")

DEFAULT_MAX_SEGMENT_BYTES = 500_000_000
DEFAULT_MAX_SEGMENT_CHUNKS = 256_000


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Limits and durability of a stream log (defaults follow Osiris where it has one).

    ``fsync``: ``"chunk"`` fsyncs after every chunk, ``"interval"`` at most every
    ``fsync_interval_ms`` (driven by appends and by the owner calling ``maybe_sync``),
    ``"never"`` leaves it to the OS (chunks become committed only on ``sync()``, segment
    rolls and close). With ``sync="fsync"`` (the default) the committed offset is the
    last fsynced chunk. ``sync="os"`` commits a chunk once its write has reached the
    operating system (the page cache): ``sync()`` commits without fdatasync, the way
    RabbitMQ streams and Kafka confirm by default; segment rolls and close still
    fsync, and a power loss can lose the committed chunks the OS had not yet written
    back (see docs/reliability.md).
    ``max_producers``: producer sequences kept in tracking snapshots (Osiris keeps 255).
    ``epoch``: the writer's epoch; opening fails if the disk holds a higher one.
    ``filter_size``: bytes of the bloom filter of chunks whose entries carry filter values
    (16..255, the stream's ``stream-filter-size-bytes``; ``formats/bloom.py``).
    """

    max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES
    max_segment_chunks: int = DEFAULT_MAX_SEGMENT_CHUNKS
    max_chunk_bytes: int = 16 * 1024 * 1024
    max_record_bytes: int = 8 * 1024 * 1024
    fsync: FsyncPolicy = "chunk"
    fsync_interval_ms: int = 200
    sync: SyncMode = "fsync"
    max_producers: int = 1_000_000
    epoch: int = 1
    filter_size: int = DEFAULT_FILTER_SIZE

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError when a value is out of range or inconsistent."""
        _positive("max_segment_bytes", self.max_segment_bytes)
        _positive("max_segment_chunks", self.max_segment_chunks)
        _positive("max_chunk_bytes", self.max_chunk_bytes)
        _positive("max_record_bytes", self.max_record_bytes)
        _positive("max_producers", self.max_producers)
        if self.max_segment_bytes > MAX_FILE_POSITION:
            raise ConfigError("max_segment_bytes must fit the index's u32 file position")
        if self.max_chunk_bytes > MAX_SIMPLE_ENTRY_BYTES:
            raise ConfigError("max_chunk_bytes must be below 2^31")
        if self.max_record_bytes + SUB_BATCH_HEADER_SIZE > self.max_chunk_bytes:
            raise ConfigError("max_record_bytes + 11 must not exceed max_chunk_bytes")
        if self.fsync not in ("chunk", "interval", "never"):
            raise ConfigError(f"fsync must be 'chunk', 'interval' or 'never', not {self.fsync!r}")
        if self.sync not in SYNC_MODES:
            raise ConfigError(f"sync must be 'fsync' or 'os', not {self.sync!r}")
        if isinstance(self.fsync_interval_ms, bool) or not isinstance(self.fsync_interval_ms, int):
            raise ConfigError("fsync_interval_ms must be an int")
        if self.fsync_interval_ms < 1:
            raise ConfigError("fsync_interval_ms must be >= 1")
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int):
            raise ConfigError("epoch must be an int")
        if not 0 <= self.epoch < 2**64:
            raise ConfigError("epoch must be in 0..2^64-1")
        try:
            check_filter_size(self.filter_size)
        except ValueError as exc:
            raise ConfigError(f"filter_size: {exc}") from None


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive int, not {value!r}")
