"""The data source's options (``spark.read.format("tierlog").option(...)``), parsed and typed.

Spark hands options over as strings; everything is checked here, once, on the driver, so a
typo fails the query at planning time with a ``ConfigError`` naming the option. Option names
are case-insensitive (Spark lower-cases them).

==========================  ==========================================================
option                      meaning
==========================  ==========================================================
``stream`` / ``streams``    one stream, or several separated by commas: ``name`` (vhost
                            ``/``) or ``vhost/name`` (split at the last ``/``)
``objectStore``             object store URI (``file:///path`` or ``s3://bucket/prefix?...``)
``metaStore``               MetaStore URI (``sqlite:///path.db`` or ``etcd://host:port/p``)
``prefix``                  key prefix of the remote tier inside the store (default empty)
``objectStore.<setting>``   extra S3 settings (e.g. ``objectStore.max_concurrency``)
``onExpired``               ``fail`` (default) or ``skip``: fragments removed by retention
                            after planning, streaming positions overtaken by retention
``targetPartitionBytes``    coalesce fragments into input partitions of about this many
                            bytes (default 64 MiB; 0 = one partition per fragment)
``includeAmqp``             add the decoded AMQP 1.0 columns (default false)
``verifyCrc``               check every chunk's CRC (default true)
``startOffset``             batch: first offset to read (inclusive)
``endOffset``               batch: offset to stop at (exclusive)
``startTimestamp``          batch: first chunk timestamp to read, ms since the epoch (incl.)
``endTimestamp``            batch: chunk timestamp to stop at, ms (exclusive)
``startingOffsets``         streaming: ``earliest`` (default), ``latest`` or JSON
                            ``{"stream": offset}``
``maxRecordsPerTrigger``    streaming: at most this many offsets per micro-batch
``maxBytesPerTrigger``      streaming: about this many fragment bytes per micro-batch
``traceDir``                testing: write one marker file per fragment read into this dir
==========================  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.log.names import validate_stream_name, validate_vhost

DEFAULT_TARGET_PARTITION_BYTES = 64 * 1024 * 1024
DEFAULT_VHOST = "/"
STORE_SETTING_PREFIX = "objectstore."

OnExpired = Literal["fail", "skip"]

_KNOWN = frozenset(
    {
        "stream",
        "streams",
        "path",
        "objectstore",
        "metastore",
        "prefix",
        "onexpired",
        "targetpartitionbytes",
        "includeamqp",
        "verifycrc",
        "startoffset",
        "endoffset",
        "starttimestamp",
        "endtimestamp",
        "startingoffsets",
        "maxrecordspertrigger",
        "maxbytespertrigger",
        "tracedir",
    }
)


@dataclass(frozen=True, slots=True)
class StreamName:
    """A stream as the options name it; ``display`` is what the ``stream`` column holds."""

    vhost: str
    name: str

    @property
    def display(self) -> str:
        return self.name if self.vhost == DEFAULT_VHOST else f"{self.vhost}/{self.name}"

    @staticmethod
    def parse(text: str) -> StreamName:
        """``name`` is in vhost ``/``; ``vhost/name`` splits at the last ``/``."""
        text = text.strip()
        vhost, sep, name = text.rpartition("/")
        if not sep:
            vhost = DEFAULT_VHOST
        elif not vhost:
            raise ConfigError(f"stream {text!r}: empty vhost (write 'name' for vhost '/')")
        try:
            validate_vhost(vhost)
            validate_stream_name(name)
        except ValueError as exc:
            raise ConfigError(f"invalid stream {text!r}: {exc}") from exc
        return StreamName(vhost, name)


@dataclass(frozen=True, slots=True)
class StartingOffsets:
    """Where a new streaming query starts: ``earliest``, ``latest`` or per stream."""

    mode: Literal["earliest", "latest", "offsets"] = "earliest"
    offsets: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    streams: tuple[StreamName, ...]
    object_store: str
    meta_store: str
    prefix: str = ""
    store_settings: tuple[tuple[str, str], ...] = ()
    on_expired: OnExpired = "fail"
    target_partition_bytes: int = DEFAULT_TARGET_PARTITION_BYTES
    include_amqp: bool = False
    verify_crc: bool = True
    start_offset: int | None = None
    end_offset: int | None = None
    start_timestamp: int | None = None
    end_timestamp: int | None = None
    starting_offsets: StartingOffsets = field(default_factory=StartingOffsets)
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    trace_dir: str | None = None

    @property
    def stream_names(self) -> tuple[str, ...]:
        return tuple(s.display for s in self.streams)


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Check and type the options Spark passes (case-insensitive names, string values)."""
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    settings = tuple(
        sorted((k[len(STORE_SETTING_PREFIX) :], v) for k, v in opts.items() if _is_setting(k))
    )
    unknown = sorted(k for k in opts if k not in _KNOWN and not _is_setting(k))
    if unknown:
        raise ConfigError(f"unknown tierlog option(s) {unknown}")
    streams = _streams(opts)
    for required in ("objectstore", "metastore"):
        if not opts.get(required):
            raise ConfigError(f"option {required!r} is required (the remote tier's URI)")
    on_expired = opts.get("onexpired", "fail").lower()
    if on_expired not in ("fail", "skip"):
        raise ConfigError(f"option onExpired must be 'fail' or 'skip', got {on_expired!r}")
    records = _int(opts, "maxrecordspertrigger", minimum=1)
    byte_limit = _int(opts, "maxbytespertrigger", minimum=1)
    if records is not None and byte_limit is not None:
        raise ConfigError("set maxRecordsPerTrigger or maxBytesPerTrigger, not both")
    target = _int(opts, "targetpartitionbytes", minimum=0)
    options = SourceOptions(
        streams=streams,
        object_store=opts["objectstore"],
        meta_store=opts["metastore"],
        prefix=opts.get("prefix", "").strip("/"),
        store_settings=settings,
        on_expired="skip" if on_expired == "skip" else "fail",
        target_partition_bytes=DEFAULT_TARGET_PARTITION_BYTES if target is None else target,
        include_amqp=_bool(opts, "includeamqp", False),
        verify_crc=_bool(opts, "verifycrc", True),
        start_offset=_int(opts, "startoffset", minimum=0),
        end_offset=_int(opts, "endoffset", minimum=0),
        start_timestamp=_int(opts, "starttimestamp"),
        end_timestamp=_int(opts, "endtimestamp"),
        starting_offsets=_starting(opts.get("startingoffsets", "earliest"), streams),
        max_records_per_trigger=records,
        max_bytes_per_trigger=byte_limit,
        trace_dir=opts.get("tracedir") or None,
    )
    return options


def _is_setting(key: str) -> bool:
    return key.startswith(STORE_SETTING_PREFIX) and len(key) > len(STORE_SETTING_PREFIX)


def _streams(opts: Mapping[str, str]) -> tuple[StreamName, ...]:
    given = [k for k in ("stream", "streams", "path") if opts.get(k)]
    if len(given) != 1:
        raise ConfigError("name the stream(s) with exactly one of 'stream' or 'streams'")
    key = given[0]
    texts = [opts[key]] if key != "streams" else opts[key].split(",")
    streams = tuple(StreamName.parse(t) for t in texts if t.strip())
    if not streams:
        raise ConfigError(f"option {key!r} names no stream")
    if len({s.display for s in streams}) != len(streams):
        raise ConfigError(f"option {key!r} names a stream twice")
    return streams


def _int(opts: Mapping[str, str], key: str, minimum: int | None = None) -> int | None:
    text = opts.get(key)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise ConfigError(f"option {key!r} must be an integer, got {text!r}") from exc
    if minimum is not None and value < minimum:
        raise ConfigError(f"option {key!r} must be >= {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    text = opts.get(key)
    if text is None:
        return default
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {key!r} must be true or false, got {text!r}")


def _starting(text: str, streams: tuple[StreamName, ...]) -> StartingOffsets:
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return StartingOffsets(mode="earliest" if value.lower() == "earliest" else "latest")
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"startingOffsets must be earliest, latest or JSON {{stream: offset}}, got {text!r}"
        ) from exc
    names = {s.display for s in streams}
    if not isinstance(data, dict) or not data:
        raise ConfigError("startingOffsets JSON must be a non-empty object {stream: offset}")
    offsets: dict[str, int] = {}
    for key, offset in data.items():
        stream = StreamName.parse(str(key)).display
        if stream not in names:
            raise ConfigError(f"startingOffsets names {key!r}, which is not read")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"startingOffsets[{key!r}] must be an offset >= 0")
        offsets[stream] = offset
    return StartingOffsets(mode="offsets", offsets=offsets)
