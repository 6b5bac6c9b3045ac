"""The server's configuration: a typed TOML file plus ``TIERLOG_*`` environment overrides.

Every value has a default, so ``tierlog serve`` with no file runs the embedded setup:
data under ``./tierlog-data``, a filesystem object store and an SQLite MetaStore
inside it. An environment variable ``TIERLOG_<SECTION>_<KEY>`` (e.g.
``TIERLOG_SERVER_PORT=5553``) overrides the file; ``TIERLOG_USERS`` takes
``name:password,name:password``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tierlog.errors import ConfigError
from tierlog.formats.bloom import DEFAULT_FILTER_SIZE
from tierlog.formats.chunk import HEADER_SIZE, SUB_BATCH_HEADER_SIZE
from tierlog.log.config import LogConfig, SyncMode
from tierlog.logs import LOG_FORMATS, LOG_LEVELS
from tierlog.remote.encryption import Keyring
from tierlog.server.auth import (
    PermissionTable,
    UserTags,
    check_stored_secret,
    parse_permissions,
    parse_tags,
)
from tierlog.server.gc_service import check_gc_settings
from tierlog.storage.retry import RetryPolicy
from tierlog.tiering.remote_ack import check_interval as check_remote_ack_interval

DEFAULT_STREAM_PORT = 5552
DEFAULT_ADMIN_PORT = 15552
DEFAULT_TLS_PORT = 5551
DEFAULT_FRAME_MAX = 1_048_576
DEFAULT_HEARTBEAT_S = 60
DELIVER_OVERHEAD = 13 + HEADER_SIZE
"""Deliver frame prefix (v2 at most) and chunk header around a chunk's data."""


@dataclass(frozen=True, slots=True)
class ServerSection:
    """Listening sockets and protocol limits. Port 0 picks a free port."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_STREAM_PORT
    admin_host: str = "127.0.0.1"
    admin_port: int = DEFAULT_ADMIN_PORT
    advertised_host: str = ""
    """Host announced in Metadata; empty = the address the client connected to."""
    advertised_port: int = 0
    frame_max: int = DEFAULT_FRAME_MAX
    heartbeat: int = DEFAULT_HEARTBEAT_S
    use_uvloop: bool = True
    use_sendfile: bool = True
    """Send local chunks with loop.sendfile when the event loop supports it (not uvloop)."""
    ready_file: str = ""
    """When set, the bound ports are written there as JSON once the server listens."""
    log_format: str = "kv"
    log_level: str = "INFO"
    writer_threads: int = 4
    """Threads that write every stream's log (each stream's writes stay in order)."""
    open_concurrency: int = 16
    """Streams opened (recovered and resolved) at once after a restart."""
    max_open_segments: int = 4096
    delayed_checkpoint_records: int = 100_000  # delayed streams: docs/delayed.md, Checkpoints
    """Active segments whose files stay open (two files each; least recently used close)."""


@dataclass(frozen=True, slots=True)
class StorageSection:
    """Where data lives. Empty URIs default to locations under ``data_dir``."""

    data_dir: str = "./tierlog-data"
    object_store: str = ""
    meta_store: str = ""

    def resolved(self) -> StorageSection:
        """Absolute data dir and concrete store URIs."""
        data_dir = os.path.abspath(self.data_dir)
        return StorageSection(
            data_dir=data_dir,
            object_store=self.object_store or f"file://{os.path.join(data_dir, 'objects')}",
            meta_store=self.meta_store or f"sqlite://{os.path.join(data_dir, 'meta.db')}",
        )

    @property
    def streams_dir(self) -> str:
        return os.path.join(os.path.abspath(self.data_dir), "streams")


@dataclass(frozen=True, slots=True)
class LogSection:
    """Local log limits, group commit and the sync mode.

    ``sync``: when a group of Publish frames is confirmed. ``"fsync"`` (default): after
    an fdatasync of the stream's segment. ``"os"``: once the writes have reached the
    operating system, without waiting for the disk, as RabbitMQ streams and Kafka do
    by default (a power loss can lose confirmed messages not yet tiered; see
    docs/reliability.md). A stream's ``x-tierlog-sync`` argument overrides it.

    ``max_chunk_bytes`` 0 means: as large as fits one Deliver frame of the server's
    ``frame_max`` (clients negotiate at most that), so a group commit of many Publish
    frames never produces a chunk a consumer cannot receive.
    """

    max_chunk_bytes: int = 0
    group_commit_max_frames: int = 256
    epoch: int = 1
    sync: str = "fsync"

    def log_config(
        self,
        max_segment_bytes: int,
        max_segment_chunks: int,
        frame_max: int,
        sync: str | None = None,
        filter_size: int = DEFAULT_FILTER_SIZE,
    ) -> LogConfig:
        """The LogConfig of a stream: fsync is driven by the broker (one per group);
        ``sync`` is the stream's own sync mode (None: the server's); ``filter_size`` its
        chunks' bloom filter size (``stream-filter-size-bytes``)."""
        chunk = self.max_chunk_bytes or frame_max - DELIVER_OVERHEAD
        return LogConfig(
            max_segment_bytes=max_segment_bytes,
            max_segment_chunks=max_segment_chunks,
            max_chunk_bytes=chunk,
            max_record_bytes=chunk - SUB_BATCH_HEADER_SIZE,
            fsync="never",
            sync=_sync_mode(sync or self.sync),
            epoch=self.epoch,
            filter_size=filter_size,
        )


def _sync_mode(value: str) -> SyncMode:
    if value == "fsync":
        return "fsync"
    if value == "os":
        return "os"
    raise ConfigError(f"log.sync must be 'fsync' or 'os', got {value!r}")


@dataclass(frozen=True, slots=True)
class AuthSection:
    """Users (plain or ``scrypt$`` passwords); users in ``loopback_users`` may only
    connect from loopback. ``tokens`` maps bearer tokens (plain or ``sha256$hex``) to
    users for the admin API. ``permissions`` is ``{user: {vhost: {configure, write,
    read}}}`` regexes; a user without an entry has full access to vhost ``/`` only.
    ``admin_hosts`` / ``admin_origins``: accepted ``Host`` / ``Origin`` of admin
    requests (empty: localhost, 127.0.0.1 and [::1] on the admin port). ``tags``:
    ``{user: ["administrator"]}``, who may use the node and cluster admin routes (None:
    ``guest``, when it is a user, as RabbitMQ's default user)."""

    users: Mapping[str, str] = field(default_factory=lambda: {"guest": "guest"})
    loopback_users: tuple[str, ...] = ("guest",)
    tokens: Mapping[str, str] = field(default_factory=dict)
    permissions: PermissionTable = field(default_factory=dict)
    tags: UserTags | None = None
    admin_hosts: tuple[str, ...] = ()
    admin_origins: tuple[str, ...] = ()
    metrics_public: bool = True
    """``GET /metrics`` without credentials (Prometheus scrapers); no secrets in it."""

    def validate(self) -> None:
        if not self.users:
            raise ConfigError("auth.users must name at least one user")
        for user, stored in self.users.items():
            check_stored_secret(stored, f"auth.users.{user}")
        for stored, user in self.tokens.items():
            check_stored_secret(stored, "auth.tokens")
            if user not in self.users:
                raise ConfigError(f"auth.tokens: a token names unknown user {user!r}")
        for user in self.permissions:
            if user not in self.users:
                raise ConfigError(f"auth.permissions names unknown user {user!r}")
        for user in self.tags or {}:
            if user not in self.users:
                raise ConfigError(f"auth.tags names unknown user {user!r}")


@dataclass(frozen=True, slots=True)
class TlsSection:
    """TLS for a second stream listener (RabbitMQ's 5551) and the admin API.

    Active when ``certfile`` and ``keyfile`` are set. ``cafile`` holds the CAs client
    certificates must chain to; ``verify_client`` is ``none``, ``optional`` or
    ``required`` (mutual TLS; SASL EXTERNAL then takes the user from the CN).
    """

    certfile: str = ""
    keyfile: str = ""
    cafile: str = ""
    port: int = DEFAULT_TLS_PORT
    verify_client: str = "none"
    plain_listener: bool = True
    """Keep the plain stream listener on ``server.port`` beside the TLS one."""
    admin: bool = True
    """Serve the admin API over HTTPS (with the same certificate) when TLS is on."""

    @property
    def enabled(self) -> bool:
        return bool(self.certfile)

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"tls.port must be 0..65535, got {self.port}")
        if self.verify_client not in ("none", "optional", "required"):
            raise ConfigError("tls.verify_client must be 'none', 'optional' or 'required'")
        if bool(self.certfile) != bool(self.keyfile):
            raise ConfigError("tls.certfile and tls.keyfile must be given together")
        if self.verify_client != "none" and not self.cafile:
            raise ConfigError("tls.verify_client needs tls.cafile")
        if not self.enabled and not self.plain_listener:
            raise ConfigError("tls.plain_listener = false needs tls.certfile and tls.keyfile")


@dataclass(frozen=True, slots=True)
class LimitsSection:
    """Per-server and per-connection resource limits (memory, sockets, handshake)."""

    max_connections: int = 4096
    max_connections_per_user: int = 1024
    max_publishers_per_connection: int = 256
    max_subscriptions_per_connection: int = 256
    preauth_frame_max: int = 8192
    """Largest frame accepted before authentication (PeerProperties, SASL)."""
    handshake_timeout_seconds: float = 10.0
    """A connection not open (authenticated, tuned, vhost opened) by then is closed."""
    request_timeout_seconds: float = 60.0
    """A client that leaves a server request (ConsumerUpdate) unanswered this long is
    disconnected, as RabbitMQ does (``request_timeout``); its consumers leave their groups."""
    connection_memory_bytes: int = 16 * 1024 * 1024
    """Decoded publishes held (by their estimated cost in memory, not their wire size)
    plus unsent output of one connection; over it, reading stops until it drains."""
    publish_memory_bytes: int = 128 * 1024 * 1024
    """Decoded publishes held across every connection of the node; over it, connections
    stop reading Publish frames until half of it is free again."""
    fragment_memory_bytes: int = 512 * 1024 * 1024
    """Fragments being built and uploaded, across all streams; uploads wait beyond it."""

    def validate(self) -> None:
        for name in (
            "max_connections",
            "max_connections_per_user",
            "max_publishers_per_connection",
            "max_subscriptions_per_connection",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"limits.{name} must be >= 1")
        if not 64 <= self.preauth_frame_max <= 1_048_576:
            raise ConfigError("limits.preauth_frame_max must be 64..1048576")
        if self.handshake_timeout_seconds <= 0:
            raise ConfigError("limits.handshake_timeout_seconds must be > 0")
        if self.request_timeout_seconds <= 0:
            raise ConfigError("limits.request_timeout_seconds must be > 0")
        if self.connection_memory_bytes < 65536:
            raise ConfigError("limits.connection_memory_bytes must be >= 65536")
        if self.publish_memory_bytes < 65536:
            raise ConfigError("limits.publish_memory_bytes must be >= 65536")
        if self.fragment_memory_bytes < 1:
            raise ConfigError("limits.fragment_memory_bytes must be >= 1")


@dataclass(frozen=True, slots=True)
class TierSection:
    """Tiering of every stream to the object store (per-stream knobs live in the
    stream's settings: fragment size, debounce, retention, local limits)."""

    enabled: bool = True
    prefix: str = ""  # key prefix inside the object store
    epoch: int = 1  # this node's writer epoch (until leases exist)
    max_uploads: int = 4
    upload_bytes_per_second: int = 0  # 0: unlimited
    read_bytes_per_second: int = 0  # all remote (cold) reads of the node; 0: unlimited
    delete_grace_seconds: float = 600.0
    retention_interval_seconds: float = 10.0
    local_retention_interval_seconds: float = 5.0
    min_free_disk_bytes: int = 0
    event_threads: int = 2
    """Threads running every stream's tiering state machine."""
    upload_threads: int = 8
    """Threads uploading fragments and committing manifests for every stream (a stream
    has at most ``max_uploads`` uploads in flight)."""
    resolution_reads: int = 8
    """Threads reading fragment trailers while streams resolve (shared)."""
    remote_ack_interval_seconds: float = 0.2
    """``ack = remote`` streams cut and commit a fragment at least this often (their
    confirms wait for the commit)."""
    gc_enabled: bool = True
    """The server deletes what no manifest references (``server/gc_service.py``)."""
    gc_interval_seconds: float = 3600.0
    gc_grace_seconds: float = 86400.0
    """Unreferenced objects younger than this are kept (> 2 x store.task_stall_seconds)."""
    gc_deletes_per_second: float = 1000.0
    """Average delete rate of a collection (0: unlimited)."""


@dataclass(frozen=True, slots=True)
class StoreSection:
    """The one retry policy of every object-store call, and start-up patience.

    A call is retried on transient failures (5xx, 429/503 SlowDown, connection reset or
    refused, timeouts, a body cut short) with exponential backoff and full jitter, for at
    most ``max_attempts`` tries and ``call_deadline_seconds``. Start-up (the object store's
    probe, opening the MetaStore) keeps retrying for ``startup_deadline_seconds`` before the
    server gives up. Each retried failure logs a warning, at most
    ``retry_warnings_per_interval`` per ``retry_warning_interval_seconds`` for each
    (operation, kind); an upload or commit in flight longer than ``task_stall_seconds`` is
    reported as stalled."""

    max_attempts: int = 6
    base_delay_seconds: float = 0.05
    max_delay_seconds: float = 5.0
    call_deadline_seconds: float = 60.0
    startup_deadline_seconds: float = 60.0
    retry_warnings_per_interval: int = 5
    retry_warning_interval_seconds: float = 10.0
    task_stall_seconds: float = 300.0

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            base_delay_s=self.base_delay_seconds,
            max_delay_s=self.max_delay_seconds,
            deadline_s=self.call_deadline_seconds,
        )

    def validate(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("store.max_attempts must be >= 1")
        if self.base_delay_seconds <= 0 or self.max_delay_seconds < self.base_delay_seconds:
            raise ConfigError("store.base_delay_seconds must be > 0 and <= max_delay_seconds")
        for name in (
            "call_deadline_seconds",
            "startup_deadline_seconds",
            "retry_warning_interval_seconds",
            "task_stall_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"store.{name} must be > 0")
        if self.retry_warnings_per_interval < 0:
            raise ConfigError("store.retry_warnings_per_interval must be >= 0")


@dataclass(frozen=True, slots=True)
class EncryptionSection:
    """Key-encryption keys of streams created with ``x-tierlog-encryption``:
    ``keys`` maps a key id to ``"base64:<32 bytes>"`` or the path of a key file (base64 text
    or 32 raw bytes); ``current`` names the key new objects are wrapped under (may be left
    out with one key). Older keys stay listed while objects wrapped under them exist.
    ``TIERLOG_KEKS`` / ``TIERLOG_KEK_FILE`` in the environment override the whole table."""

    keys: Mapping[str, str] = field(default_factory=dict)
    current: str = ""

    def keyring(self) -> Keyring | None:
        """The configured keyring (None without keys); ConfigError when a key is bad."""
        if not self.keys:
            if self.current:
                raise ConfigError("encryption.current is set but encryption.keys is empty")
            return None
        return Keyring.from_table(self.keys, self.current, source="encryption")


@dataclass(frozen=True, slots=True)
class ClusterSection:
    """Running as one node of a cluster (the ``[cluster]`` table). Off while ``node`` is
    empty: the server is then a single node, as without the table.

    Nodes share one MetaStore (``storage.meta_store``: etcd, or one SQLite file for
    processes on one host) and one object store; each has its own data directory. Each
    node holds one lease (``lease_ttl_seconds``) and leads the streams it acquired; a
    leader confirms only until ``last renewal + TTL - drift_seconds``.
    ``*_address`` are ``host:port`` strings announced to clients, admins and peers
    (empty: this server's own listener address). ``initial_cluster_size`` is the
    default replication factor of new streams (RabbitMQ's ``x-initial-cluster-size``
    argument overrides it); above 1 it needs ``secret``, the shared secret that
    authenticates replication links between nodes (listening on ``replication_port``,
    0: a free port). ``scan_interval_seconds``: how often the directory is read
    (one read for every stream) to take over streams whose leader's lease is gone.

    ``tls_certfile``, ``tls_keyfile`` and ``tls_cafile`` (all three, or none) put every
    replication link under mutual TLS: each node presents its certificate and accepts
    only peers whose certificate chains to ``tls_cafile`` (the cluster's own CA), on top
    of the secret's proof. ``max_incoming_links`` caps the incoming replication
    connections open at once (handshaking or linked); ``handshake_timeout_seconds`` is
    the deadline of a link's whole handshake (TLS and proof).
    """

    node: str = ""
    stream_address: str = ""
    admin_address: str = ""
    replication_address: str = ""
    replication_port: int = 0
    secret: str = ""
    lease_ttl_seconds: float = 10.0
    drift_seconds: float = 1.5
    initial_cluster_size: int = 1
    scan_interval_seconds: float = 1.0
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_cafile: str = ""
    max_incoming_links: int = 64
    handshake_timeout_seconds: float = 5.0

    @property
    def enabled(self) -> bool:
        return bool(self.node)

    @property
    def tls(self) -> bool:
        return bool(self.tls_certfile)

    def validate(self) -> None:
        if not self.enabled:
            for f in fields(self):
                if f.name != "node" and getattr(self, f.name) != f.default:
                    raise ConfigError(f"cluster.{f.name} is set but cluster.node is empty")
            return
        if not _NODE_NAME.fullmatch(self.node):
            raise ConfigError(
                f"cluster.node must be 1-64 letters, digits, '.', '_' or '-', got {self.node!r}"
            )
        for name in ("stream_address", "admin_address", "replication_address"):
            value = getattr(self, name)
            if value:
                _check_address(f"cluster.{name}", value)
        if self.lease_ttl_seconds < 1.0:
            raise ConfigError(
                f"cluster.lease_ttl_seconds must be >= 1, got {self.lease_ttl_seconds}"
            )
        if not 0 < self.drift_seconds < self.lease_ttl_seconds / 2:
            raise ConfigError(
                "cluster.drift_seconds must be > 0 and below half of cluster.lease_ttl_seconds,"
                f" got {self.drift_seconds}"
            )
        if not 0.05 <= self.scan_interval_seconds <= self.lease_ttl_seconds:
            raise ConfigError(
                "cluster.scan_interval_seconds must be 0.05..cluster.lease_ttl_seconds,"
                f" got {self.scan_interval_seconds}"
            )
        if not 1 <= self.initial_cluster_size <= 9:
            raise ConfigError(
                f"cluster.initial_cluster_size must be 1..9, got {self.initial_cluster_size}"
            )
        if not 0 <= self.replication_port <= 65535:
            raise ConfigError(
                f"cluster.replication_port must be 0..65535, got {self.replication_port}"
            )
        # Without a secret no replication link can be authenticated: the settings that
        # only matter to replication would do nothing, so they are refused.
        if not self.secret:
            if self.initial_cluster_size != 1:
                raise ConfigError(
                    "cluster.initial_cluster_size above 1 needs replication between nodes:"
                    " set cluster.secret (the same on every node)"
                )
            for name in (
                "replication_address",
                "replication_port",
                "tls_certfile",
                "tls_keyfile",
                "tls_cafile",
            ):
                if getattr(self, name):
                    raise ConfigError(f"cluster.{name} needs cluster.secret (replication)")
            for name in ("max_incoming_links", "handshake_timeout_seconds"):
                if getattr(self, name) != ClusterSection.__dataclass_fields__[name].default:
                    raise ConfigError(f"cluster.{name} needs cluster.secret (replication)")
        elif len(self.secret) < 16:
            raise ConfigError("cluster.secret must be at least 16 characters")
        tls_files = (self.tls_certfile, self.tls_keyfile, self.tls_cafile)
        if any(tls_files) and not all(tls_files):
            raise ConfigError(
                "cluster.tls_certfile, cluster.tls_keyfile and cluster.tls_cafile go together"
                " (replication links use mutual TLS: every node presents a certificate and"
                " checks its peers' against the cluster CA)"
            )
        if not 1 <= self.max_incoming_links <= 4096:
            raise ConfigError(
                f"cluster.max_incoming_links must be 1..4096, got {self.max_incoming_links}"
            )
        if not 0.5 <= self.handshake_timeout_seconds <= 120:
            raise ConfigError(
                "cluster.handshake_timeout_seconds must be 0.5..120,"
                f" got {self.handshake_timeout_seconds}"
            )


_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _check_address(setting: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{setting} must be host:port with a port 1..65535, got {value!r}")


@dataclass(frozen=True, slots=True)
class ReaderSection:
    """Read anywhere. ``read_only``: this node is a member of no stream; it opens no local
    log and serves every catalog stream read-only from the remote tier, following new
    manifest commits by polling their pointers (each stream every
    ``poll_interval_seconds``, at most ``max_pointer_reads_per_second`` in all)."""

    read_only: bool = False
    poll_interval_seconds: float = 0.5
    max_pointer_reads_per_second: float = 200.0

    def validate(self) -> None:
        if not 0.01 <= self.poll_interval_seconds <= 60:
            raise ConfigError("reader.poll_interval_seconds must be 0.01..60")
        if self.max_pointer_reads_per_second <= 0:
            raise ConfigError("reader.max_pointer_reads_per_second must be > 0")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    server: ServerSection = field(default_factory=ServerSection)
    storage: StorageSection = field(default_factory=StorageSection)
    log: LogSection = field(default_factory=LogSection)
    auth: AuthSection = field(default_factory=AuthSection)
    tier: TierSection = field(default_factory=TierSection)
    tls: TlsSection = field(default_factory=TlsSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    store: StoreSection = field(default_factory=StoreSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    encryption: EncryptionSection = field(default_factory=EncryptionSection)
    reader: ReaderSection = field(default_factory=ReaderSection)

    def validate(self) -> ServerConfig:
        s = self.server
        for name in ("port", "admin_port", "advertised_port"):
            value = getattr(s, name)
            if not 0 <= value <= 65535:
                raise ConfigError(f"server.{name} must be 0..65535, got {value}")
        if not 1024 <= s.frame_max <= 0xFFFFFFFF:
            raise ConfigError(f"server.frame_max must be 1024..4294967295, got {s.frame_max}")
        if s.heartbeat < 0:
            raise ConfigError(f"server.heartbeat must be >= 0 (seconds), got {s.heartbeat}")
        if s.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"server.log_format must be one of {', '.join(LOG_FORMATS)}, got {s.log_format!r}"
            )
        if s.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(
                f"server.log_level must be one of {', '.join(LOG_LEVELS)}, got {s.log_level!r}"
            )
        if self.log.group_commit_max_frames < 1:
            raise ConfigError("log.group_commit_max_frames must be >= 1")
        for section, name, value, low, high in (
            ("server", "writer_threads", s.writer_threads, 1, 256),
            ("server", "open_concurrency", s.open_concurrency, 1, 1024),
            ("server", "max_open_segments", s.max_open_segments, 16, 1 << 20),
            ("server", "delayed_checkpoint_records", s.delayed_checkpoint_records, 1, 1 << 40),
            ("tier", "event_threads", self.tier.event_threads, 1, 256),
            ("tier", "upload_threads", self.tier.upload_threads, 1, 256),
            ("tier", "resolution_reads", self.tier.resolution_reads, 1, 256),
        ):
            if not low <= value <= high:
                raise ConfigError(f"{section}.{name} must be {low}..{high}, got {value}")
        self.log.log_config(500_000_000, 256_000, s.frame_max)  # validates chunk limits
        self.auth.validate()
        self.tls.validate()
        self.limits.validate()
        t = self.tier
        if t.read_bytes_per_second < 0:
            raise ConfigError("tier.read_bytes_per_second must be >= 0 (0: unlimited)")
        if t.epoch < 1 or t.max_uploads < 1 or t.upload_bytes_per_second < 0:
            raise ConfigError("tier.epoch and tier.max_uploads must be >= 1, rates >= 0")
        for name in (
            "delete_grace_seconds",
            "retention_interval_seconds",
            "local_retention_interval_seconds",
        ):
            if getattr(t, name) < 0:
                raise ConfigError(f"tier.{name} must be >= 0")
        check_remote_ack_interval(t.remote_ack_interval_seconds)
        check_gc_settings(self, TierSection())
        self.reader.validate()
        self.store.validate()
        self.cluster.validate()
        if self.cluster.enabled and (t.epoch != 1 or self.log.epoch != 1):
            raise ConfigError(
                "tier.epoch and log.epoch are taken from stream leadership in a cluster;"
                " leave them unset when cluster.node is set"
            )
        self.encryption.keyring()  # loads and checks every key file now, not at first use
        return self


_SECTIONS: dict[str, type[Any]] = {
    "server": ServerSection,
    "storage": StorageSection,
    "log": LogSection,
    "auth": AuthSection,
    "tier": TierSection,
    "tls": TlsSection,
    "limits": LimitsSection,
    "store": StoreSection,
    "cluster": ClusterSection,
    "encryption": EncryptionSection,
    "reader": ReaderSection,
}


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    where = f"{section}.{key}"
    if section == "auth" and key == "permissions":
        return parse_permissions(value, where)
    if section == "auth" and key == "tags":
        return parse_tags(value, where)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where} must be a boolean, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if isinstance(default, int):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be an integer, got {value!r}") from None
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(default, tuple):
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where} must be a list of strings, got {value!r}")
    if section == "encryption" and key == "keys":
        if isinstance(value, str):  # TIERLOG_ENCRYPTION_KEYS="id:base64:...,id2:/path"
            pairs = [p.split(":", 1) for p in value.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ConfigError(f"{where} must look like 'id:base64:<key>,id2:/key/file'")
            return {k.strip(): v.strip() for k, v in pairs}
        if isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return dict(value)
        raise ConfigError(f'{where} must be a table of id = "base64:<key>" or "<key file>"')
    if isinstance(default, Mapping):
        if isinstance(value, str):
            pairs = [p.split(":", 1) for p in value.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ConfigError(f"{where} must look like 'user:password,user:password'")
            return {k.strip(): v for k, v in pairs}
        if isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return dict(value)
        raise ConfigError(f"{where} must be a table of user = password")
    raise ConfigError(f"{where}: unsupported type")  # pragma: no cover


def _setting_names() -> list[str]:
    return [f"{section}.{f.name}" for section, cls in _SECTIONS.items() for f in fields(cls)]


def _env_name(setting: str) -> str:
    return "TIERLOG_" + setting.replace(".", "_").upper()


def _closest(given: str, key: str, env: bool) -> str | None:
    """The setting closest to a misspelt one: by the whole name (``sever_port``,
    ``server.log_levl``) or by the key alone (``log_level`` under the wrong section)."""
    best, best_score = None, SUGGEST_CUTOFF
    for setting in _setting_names():
        full = setting.replace(".", "_") if env else setting
        score = max(
            difflib.SequenceMatcher(None, given, full).ratio() if env else 0.0,
            difflib.SequenceMatcher(None, key, setting.partition(".")[2]).ratio(),
        )
        if score > best_score:
            best, best_score = setting, score
    return best


def _unknown_setting(section: str, key: str, env: str) -> ConfigError:
    if env:
        rest = env[len("TIERLOG_") :].lower()
        close = _closest(rest, rest, env=True)
        hint = f"; did you mean {_env_name(close)}?" if close else ""
        return ConfigError(f"unknown setting {env}{hint}")
    close = _closest(f"{section}.{key}", key, env=False)
    hint = f"; did you mean {close}?" if close else ""
    return ConfigError(f"unknown setting {section}.{key}{hint}")


SUGGEST_CUTOFF = 0.8
"""How alike (difflib ratio) a name must be to a setting's to be suggested."""


def _apply(
    config: ServerConfig, section: str, values: Mapping[str, Any], env: str = ""
) -> ServerConfig:
    """Set ``values`` in ``section``; ``env`` names the variable they came from."""
    current = getattr(config, section)
    known = {f.name for f in fields(current)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise _unknown_setting(section, key, env)
        try:
            changes[key] = _coerce(section, key, value, getattr(current, key))
        except ConfigError as exc:
            raise ConfigError(f"{env}: {exc}" if env else str(exc)) from None
    return replace(config, **{section: replace(current, **changes)})


def load_config(path: str | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Defaults, then the TOML file (if any), then ``TIERLOG_*`` variables; validated."""
    config = ServerConfig()
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
        for section, values in data.items():
            if section not in _SECTIONS:
                close = difflib.get_close_matches(section, list(_SECTIONS), n=1)
                hint = f"; did you mean [{close[0]}]?" if close else ""
                raise ConfigError(f"unknown config section [{section}]{hint}")
            if not isinstance(values, dict):
                raise ConfigError(f"[{section}] must be a table of settings")
            config = _apply(config, section, values)
    env = os.environ if environ is None else environ
    for name, value in env.items():
        if not name.startswith("TIERLOG_"):
            continue
        rest = name[len("TIERLOG_") :].lower()
        if rest == "users":
            config = _apply(config, "auth", {"users": value}, env=name)
            continue
        section, _, key = rest.partition("_")
        if section in _SECTIONS and key:
            config = _apply(config, section, {key: value}, env=name)
        elif not name.startswith(_OTHER_ENV_PREFIXES) and _closest(rest, rest, env=True):
            # Not ours to reject (other tools share the prefix) unless it is a near miss.
            raise _unknown_setting(section, key, name)
    return config.validate()


_OTHER_ENV_PREFIXES = ("TIERLOG_S3_", "TIERLOG_KEK")
"""``TIERLOG_*`` variables read elsewhere (the S3 backend's ``S3Config.from_env``)."""
