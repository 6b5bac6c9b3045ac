"""The data source's options (``spark.read.format("tierlog").option(...)``), parsed and typed.

Spark hands options over as strings; everything is checked here, once, on the driver, so a
typo fails the query at planning time with a ``ConfigError`` naming the option. Option names
are case-insensitive (Spark lower-cases them). The Kafka source's names work too, with the
same meaning (docs/spark.md has the mapping); an option that would do nothing in a batch
or a streaming read is refused there (``check_mode``).

==========================  ==========================================================
option                      meaning
==========================  ==========================================================
``stream`` / ``streams``    one stream, or several separated by commas: ``name`` (vhost
/ ``subscribe``             ``/``) or ``vhost/name`` (split at the last ``/``)
``subscribePattern``        a regex; every stream whose ``stream`` column value matches
                            it whole, resolved when the query starts
``objectStore``             object store URI (``file:///path`` or ``s3://bucket/prefix?...``)
``metaStore``               MetaStore URI (``sqlite:///path.db`` or ``etcd://host:port/p``)
``prefix``                  key prefix of the remote tier inside the store (default empty)
``objectStore.<setting>``   extra S3 settings (e.g. ``objectStore.max_concurrency``)
``onExpired`` /             ``fail`` (default; ``failOnDataLoss=true``) or ``skip``
``failOnDataLoss``          (``false``): data removed by retention before it was read
``targetPartitionBytes``    coalesce fragments into input partitions of about this many
                            bytes (default 64 MiB; 0 = one partition per fragment)
``includeAmqp``             add the decoded AMQP 1.0 columns (default false)
``verifyCrc``               check every chunk's CRC (default true)
``startOffset``             batch: first offset to read (inclusive)
``endOffset``               batch: offset to stop at (exclusive)
``startTimestamp``          batch: first chunk timestamp to read, ms since the epoch (incl.)
``endTimestamp`` /          batch: chunk timestamp to stop at, ms (exclusive)
``endingTimestamp``
``startingOffsets``         ``earliest`` (default), ``latest`` (streaming only) or JSON
                            ``{"stream": offset}`` (-2 = earliest, -1 = latest)
``endingOffsets``           batch: ``latest`` (default) or JSON ``{"stream": offset}``
                            (exclusive; -1 = latest)
``startingTimestamp``       start at the first chunk with a timestamp >= this (ms)
``maxRecordsPerTrigger`` /  streaming: at most this many offsets per micro-batch
``maxOffsetsPerTrigger``
``maxBytesPerTrigger``      streaming: about this many fragment bytes per micro-batch
``minOffsetsPerTrigger``    streaming: wait for this many new offsets before a micro-batch,
                            at most ``maxTriggerDelay`` (default ``15m``)
``server``                  ``host:port`` of the stream server; with it batch and streaming
                            reads also cover the un-tiered tail (``includeTail``, default
                            true)
``user`` / ``password``     the server's credentials (default guest / guest)
``traceDir``                testing: write one marker file per fragment read into this dir
==========================  ==========================================================
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.log.names import validate_stream_name, validate_vhost

DEFAULT_TARGET_PARTITION_BYTES = 64 * 1024 * 1024
DEFAULT_VHOST = "/"
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0
EARLIEST = -2  # Kafka's JSON offsets: -2 = earliest, -1 = latest
LATEST = -1
STORE_SETTING_PREFIX = "objectstore."

OnExpired = Literal["fail", "skip"]

_ALIASES = {
    "subscribe": "streams",
    "maxoffsetspertrigger": "maxrecordspertrigger",
    "endingtimestamp": "endtimestamp",
}
"""Kafka source names that mean exactly what one of ours means."""

SOURCE_OPTIONS = (
    "stream",
    "streams",
    "path",
    "subscribePattern",
    "objectStore",
    "metaStore",
    "prefix",
    "onExpired",
    "failOnDataLoss",
    "targetPartitionBytes",
    "includeAmqp",
    "verifyCrc",
    "startOffset",
    "endOffset",
    "startTimestamp",
    "endTimestamp",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "maxRecordsPerTrigger",
    "maxBytesPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "traceDir",
    "includeTail",
    "server",
    "user",
    "password",
)
"""The source's options as the docs write them (Spark hands them over lower-cased)."""

_KNOWN = frozenset(name.lower() for name in SOURCE_OPTIONS)

BATCH_ONLY = frozenset(
    {
        "startoffset",
        "endoffset",
        "starttimestamp",
        "endtimestamp",
        "endingoffsets",
    }
)
STREAM_ONLY = frozenset(
    {"maxrecordspertrigger", "maxbytespertrigger", "minoffsetspertrigger", "maxtriggerdelay"}
)

_KAFKA_WITHOUT_EQUIVALENT = {
    "kafka.bootstrap.servers": "the source reads the remote tier: set objectStore and metaStore",
    "assign": "name streams with 'streams' (a stream has no partitions)",
    "startingoffsetsbytimestamp": "use startingTimestamp (one timestamp for every stream)",
    "endingoffsetsbytimestamp": "use endTimestamp / endingTimestamp",
    "startingoffsetsbytimestampstrategy": "startingTimestamp past the end starts at the end",
    "groupidprefix": "there are no consumer groups: the checkpoint holds the positions",
    "kafka.group.id": "there are no consumer groups: the checkpoint holds the positions",
    "includeheaders": "use includeAmqp=true for the AMQP properties columns",
    "minpartitions": "use targetPartitionBytes",
    "maxrecordsperpartition": "use targetPartitionBytes",
}
"""Kafka source options that have no meaning here, and what to use instead."""


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
    """Where a read starts: ``earliest``, ``latest`` or per stream (``offsets``; streams
    not named start at earliest; the values ``EARLIEST`` / ``LATEST`` are allowed)."""

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
    ending_offsets: Mapping[str, int] = field(default_factory=dict)  # LATEST or an offset
    starting_timestamp: int | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY_S
    stream_pattern: str | None = None
    trace_dir: str | None = None
    server: tuple[str, int] | None = None  # include the tail through this server
    user: str = "guest"
    password: str = field(default="guest", repr=False)
    given: frozenset[str] = frozenset()  # option names as set (aliases resolved)

    @property
    def stream_names(self) -> tuple[str, ...]:
        return tuple(s.display for s in self.streams)

    def check_mode(self, mode: Literal["batch", "stream"]) -> None:
        """Refuse options that would do nothing in this kind of read."""
        other = STREAM_ONLY if mode == "batch" else BATCH_ONLY
        ignored = sorted(self.given & other)
        if ignored:
            kind = "streaming" if mode == "batch" else "batch"
            raise ConfigError(f"option(s) {ignored} only apply to {kind} reads")
        if mode == "batch" and (
            self.starting_offsets.mode == "latest"
            or LATEST in self.starting_offsets.offsets.values()
        ):
            raise ConfigError("startingOffsets 'latest' (-1) is for streaming reads only")


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Check and type the options Spark passes (case-insensitive names, string values)."""
    opts: dict[str, str] = {}
    for key, value in raw.items():
        name = str(key).lower()
        if name in _KAFKA_WITHOUT_EQUIVALENT:
            raise ConfigError(
                f"option {key!r} (Kafka source) has no tierlog equivalent: "
                f"{_KAFKA_WITHOUT_EQUIVALENT[name]}"
            )
        canonical = _ALIASES.get(name, name)
        if canonical in opts:
            raise ConfigError(f"option {key!r} given twice (under two names)")
        opts[canonical] = str(value)
    settings = tuple(
        sorted((k[len(STORE_SETTING_PREFIX) :], v) for k, v in opts.items() if _is_setting(k))
    )
    unknown = sorted(k for k in opts if k not in _KNOWN and not _is_setting(k))
    if unknown:
        raise unknown_options(unknown, (*SOURCE_OPTIONS, "subscribe", "maxOffsetsPerTrigger"))
    streams, pattern = _streams(opts)
    for required in ("objectstore", "metastore"):
        if not opts.get(required):
            raise ConfigError(f"option {required!r} is required (the remote tier's URI)")
    on_expired = _on_expired(opts)
    records = _int(opts, "maxrecordspertrigger", minimum=1)
    byte_limit = _int(opts, "maxbytespertrigger", minimum=1)
    if records is not None and byte_limit is not None:
        raise ConfigError("set maxRecordsPerTrigger or maxBytesPerTrigger, not both")
    min_offsets = _int(opts, "minoffsetspertrigger", minimum=1)
    if "maxtriggerdelay" in opts and min_offsets is None:
        raise ConfigError("maxTriggerDelay only applies with minOffsetsPerTrigger")
    if min_offsets is not None and records is not None and min_offsets > records:
        raise ConfigError("minOffsetsPerTrigger is larger than maxOffsetsPerTrigger")
    starting_ts = _int(opts, "startingtimestamp", minimum=0)
    if starting_ts is not None and ("startingoffsets" in opts or "starttimestamp" in opts):
        raise ConfigError("set startingTimestamp or startingOffsets / startTimestamp, not both")
    target = _int(opts, "targetpartitionbytes", minimum=0)
    names = {s.display for s in streams}
    options = SourceOptions(
        streams=streams,
        object_store=opts["objectstore"],
        meta_store=opts["metastore"],
        prefix=opts.get("prefix", "").strip("/"),
        store_settings=settings,
        on_expired=on_expired,
        target_partition_bytes=DEFAULT_TARGET_PARTITION_BYTES if target is None else target,
        include_amqp=_bool(opts, "includeamqp", False),
        verify_crc=_bool(opts, "verifycrc", True),
        start_offset=_int(opts, "startoffset", minimum=0),
        end_offset=_int(opts, "endoffset", minimum=0),
        start_timestamp=_int(opts, "starttimestamp"),
        end_timestamp=_int(opts, "endtimestamp"),
        starting_offsets=_starting(opts.get("startingoffsets", "earliest"), names, pattern),
        ending_offsets=_ending(opts.get("endingoffsets", "latest"), names, pattern),
        starting_timestamp=starting_ts,
        max_records_per_trigger=records,
        max_bytes_per_trigger=byte_limit,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay=_duration(opts, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_S),
        stream_pattern=pattern,
        trace_dir=opts.get("tracedir") or None,
        server=_server(opts),
        user=opts.get("user", "guest"),
        password=opts.get("password", "guest"),
        given=frozenset(k for k in opts if not _is_setting(k)),
    )
    return options


def with_streams(options: SourceOptions, streams: tuple[StreamName, ...]) -> SourceOptions:
    """``options`` reading ``streams`` (what a ``subscribePattern`` resolved to)."""
    names = {s.display for s in streams}
    for what, keys in (
        ("startingOffsets", options.starting_offsets.offsets),
        ("endingOffsets", options.ending_offsets),
    ):
        stray = sorted(set(keys) - names)
        if stray:
            raise ConfigError(f"{what} names {stray}, which subscribePattern does not match")
    return replace(options, streams=streams)


def matching_streams(pattern: str, displays: list[str]) -> tuple[StreamName, ...]:
    """The streams whose ``stream`` column value matches ``pattern`` whole, sorted."""
    regex = re.compile(pattern)
    found = sorted(d for d in displays if regex.fullmatch(d))
    if not found:
        raise ConfigError(f"subscribePattern {pattern!r} matches no stream")
    return tuple(StreamName.parse(d) for d in found)


def _on_expired(opts: Mapping[str, str]) -> OnExpired:
    on_expired = opts.get("onexpired", "fail").lower()
    if on_expired not in ("fail", "skip"):
        raise ConfigError(f"option onExpired must be 'fail' or 'skip', got {on_expired!r}")
    if "failondataloss" in opts:
        from_kafka = "fail" if _bool(opts, "failondataloss", True) else "skip"
        if "onexpired" in opts and from_kafka != on_expired:
            raise ConfigError("failOnDataLoss and onExpired disagree: set one of them")
        on_expired = from_kafka
    return "skip" if on_expired == "skip" else "fail"


def _server(opts: Mapping[str, str]) -> tuple[str, int] | None:
    """The server to read the tail through: ``server`` unless ``includeTail=false``."""
    include = _bool(opts, "includetail", "server" in opts)
    text = opts.get("server", "")
    if not include:
        if text or "user" in opts or "password" in opts:
            raise ConfigError("server / user / password only apply with includeTail=true")
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"includeTail needs option 'server' as host:port, got {text!r}")
    return host.strip("[]"), int(port)


def _duration(opts: Mapping[str, str], key: str, default: float) -> float:
    """``15m``, ``30s``, ``500ms``, ``2h`` or plain seconds."""
    text = opts.get(key)
    if text is None:
        return default
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*", text.lower())
    if not match:
        raise ConfigError(f"option {key!r} must be a duration like 15m, 30s or 500ms")
    scale = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[match[2] or "s"]
    return float(match[1]) * scale


def _is_setting(key: str) -> bool:
    return key.startswith(STORE_SETTING_PREFIX) and len(key) > len(STORE_SETTING_PREFIX)


def _streams(opts: Mapping[str, str]) -> tuple[tuple[StreamName, ...], str | None]:
    """The named streams, or the ``subscribePattern`` (resolved later, against the catalog)."""
    given = [k for k in ("stream", "streams", "path", "subscribepattern") if opts.get(k)]
    if len(given) != 1:
        raise ConfigError(
            "name the stream(s) with exactly one of 'stream', 'streams' / 'subscribe' or "
            "'subscribePattern'"
        )
    key = given[0]
    if key == "subscribepattern":
        try:
            re.compile(opts[key])
        except re.error as exc:
            raise ConfigError(f"subscribePattern {opts[key]!r} is not a regex: {exc}") from None
        return (), opts[key]
    texts = [opts[key]] if key != "streams" else opts[key].split(",")
    streams = tuple(StreamName.parse(t) for t in texts if t.strip())
    if not streams:
        raise ConfigError(f"option {key!r} names no stream")
    if len({s.display for s in streams}) != len(streams):
        raise ConfigError(f"option {key!r} names a stream twice")
    return streams, None


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


def _offsets_json(
    what: str, text: str, names: set[str], pattern: str | None, allowed: tuple[int, ...]
) -> dict[str, int]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{what} must be earliest, latest or JSON {{stream: offset}}, got {text!r}"
        ) from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{what} JSON must be a non-empty object {{stream: offset}}")
    offsets: dict[str, int] = {}
    for key, offset in data.items():
        stream = StreamName.parse(str(key)).display
        if pattern is None and stream not in names:
            raise ConfigError(f"{what} names {key!r}, which is not read")
        if (
            not isinstance(offset, int)
            or isinstance(offset, bool)
            or (offset < 0 and offset not in allowed)
        ):
            special = " or ".join(str(a) for a in allowed)
            raise ConfigError(f"{what}[{key!r}] must be an offset >= 0 or {special}")
        offsets[stream] = offset
    return offsets


def _starting(text: str, names: set[str], pattern: str | None) -> StartingOffsets:
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return StartingOffsets(mode="earliest" if value.lower() == "earliest" else "latest")
    offsets = _offsets_json("startingOffsets", value, names, pattern, (EARLIEST, LATEST))
    return StartingOffsets(mode="offsets", offsets=offsets)


def _ending(text: str, names: set[str], pattern: str | None) -> dict[str, int]:
    value = text.strip()
    if value.lower() == "latest":
        return {}
    if value.lower() == "earliest":
        raise ConfigError("endingOffsets 'earliest' would read nothing: use latest or JSON")
    return _offsets_json("endingOffsets", value, names, pattern, (LATEST,))


def unknown_options(given: Sequence[str], names: Sequence[str]) -> ConfigError:
    """The one error for options nobody reads: each named with the closest valid name
    (as the server's configuration suggests), so a typo never passes as a no-op."""
    by_lower = {name.lower(): name for name in names}
    parts = []
    for key in given:
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
        parts.append(f"{key!r}{hint}")
    return ConfigError(f"unknown tierlog option(s) {', '.join(parts)} (docs/spark.md lists them)")
