"""``tierlog serve``: wire config, stores, catalog, broker, protocol and admin listeners.

``Server`` runs inside an event loop (tests start it in-process); ``serve()`` is the
command: uvloop when available, structured log lines, SIGTERM / SIGINT stop it
cleanly (listeners closed, queued publishes written, logs fsynced and closed), SIGHUP
reloads users, permissions and TLS certificates (``reload.py``), and a restart resumes
from the same data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import resource
import signal
import sqlite3
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

import tierlog
from tierlog.delayed.port import SchedulerConfig
from tierlog.errors import ConfigError, TierlogError
from tierlog.log.segments import ACTIVE_FILES
from tierlog.logs import get_logger, redact_uri, setup_logging
from tierlog.metrics import Metrics
from tierlog.read.remote_cursor import default_prefetcher
from tierlog.remote.catalog import Catalog
from tierlog.remote.encryption import install_configured_keyring
from tierlog.server.admin import build_admin_app
from tierlog.server.admin_security import AdminGuard
from tierlog.server.allocator import tune_allocator
from tierlog.server.broker import (
    Broker,
    LagProvider,
    RemoteStatusProvider,
    StreamHandle,
    no_lag,
)
from tierlog.server.cluster_admin import add_cluster_routes
from tierlog.server.cluster_metrics import watch_cluster
from tierlog.server.cluster_service import ClusterService
from tierlog.server.config import ServerConfig
from tierlog.server.connection import Connection
from tierlog.server.data_dir_lock import DataDirLock
from tierlog.server.delayed_service import DelayedService
from tierlog.server.errors import ListenError, StoreUnavailableError
from tierlog.server.health import Health, no_degraded_streams
from tierlog.server.limits import Gatekeeper
from tierlog.server.non_member_reads import NonMemberReads
from tierlog.server.read_only import ReadOnlyBroker
from tierlog.server.reload import ConfigReloader
from tierlog.server.tiering_service import TieringService
from tierlog.server.tls import server_context
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.retry import RETRY_LOG
from tierlog.storage.startup import open_meta_store_for_startup, open_object_store_for_startup

GIL_SWITCH_INTERVAL = 0.001
"""Seconds a thread may hold the GIL while another waits for it (``serve`` only)."""

log = get_logger("tierlog.server")


def _local_bytes(handle: StreamHandle) -> int:
    total = 0
    for ref in handle.log.segment_refs():
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(ref.segment_path) + os.path.getsize(ref.index_path)
    return total


class Server:
    """A running tierlog server (stream protocol + admin HTTP) inside the current loop."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        lag_provider: LagProvider = no_lag,
        remote_status: RemoteStatusProvider | None = None,
        reload_config: Callable[[], ServerConfig] | None = None,
    ) -> None:
        self.config = config
        self._reload_config = reload_config
        self.reloader: ConfigReloader | None = None
        self.health: Health | None = None
        # the [encryption] keys become the process keyring (the environment overrides them)
        install_configured_keyring(config.encryption.keyring())
        self.storage = config.storage.resolved()
        self.metrics = Metrics()
        self.meta: MetaStore | None = None
        self.object_store: ObjectStore | None = None
        self.tiering: TieringService | None = None
        self.broker: Broker | None = None
        self.cluster: ClusterService | None = None
        self.non_member_reads: NonMemberReads | None = None
        self.delayed: DelayedService | None = None
        self._lag_provider = lag_provider
        self._remote_status = remote_status
        self._server: asyncio.AbstractServer | None = None
        self._tls_server: asyncio.AbstractServer | None = None
        self.tls_port = 0
        self._runner: web.AppRunner | None = None
        self.stream_port = 0
        self.admin_port = 0
        self._stopped = asyncio.Event()
        self._ready_task: asyncio.Task[None] | None = None
        self._lock = DataDirLock(self.storage.data_dir)

    async def start(self) -> None:
        """Open the stores, the streams and the listeners. A failure leaves nothing open
        and is a ``StartupError`` naming what failed and the setting behind it."""
        try:
            await self._start()
        except BaseException:
            await self._close()
            raise

    async def _start(self) -> None:
        storage = self.storage
        _raise_open_files_limit()
        ACTIVE_FILES.max_open = self.config.server.max_open_segments
        try:
            os.makedirs(storage.data_dir, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create the data directory {storage.data_dir} (storage.data_dir): "
                f"{exc.strerror or exc}"
            ) from exc
        self._lock.acquire()  # one server per data directory, for the process lifetime
        # start-up rides out a flaky store: each step retried up to store.startup_deadline_seconds
        store = self.config.store
        RETRY_LOG.configure(store.retry_warning_interval_seconds, store.retry_warnings_per_interval)
        policy, deadline = store.retry_policy(), store.startup_deadline_seconds
        self.meta = await _open_store(
            "MetaStore",
            "storage.meta_store",
            storage.meta_store,
            lambda uri: open_meta_store_for_startup(uri, policy, deadline),
        )
        catalog = Catalog(self.meta)
        lag_provider, remote_status = self._lag_provider, self._remote_status
        if self.config.reader.read_only:  # read anywhere: no local streams, no writes
            self.object_store = await _open_store(
                "object store",
                "storage.object_store",
                storage.object_store,
                lambda uri: open_object_store_for_startup(uri, policy, deadline),
            )
            self.broker = ReadOnlyBroker(self.config, catalog, self.metrics, self.object_store)
        elif self.config.tier.enabled:
            self.object_store = await _open_store(
                "object store",
                "storage.object_store",
                storage.object_store,
                lambda uri: open_object_store_for_startup(uri, policy, deadline),
            )
            default_prefetcher().rate_limit.set_rate(self.config.tier.read_bytes_per_second)
            self.tiering = TieringService(self.config, self.object_store, catalog, self.metrics)
            await self.tiering.start()
            if lag_provider is no_lag:
                lag_provider = self.tiering.lag
            if remote_status is None:
                remote_status = self.tiering
        if self.broker is None:
            self.broker = Broker(
                self.config,
                catalog,
                self.metrics,
                lag_provider=lag_provider,
                remote_status=remote_status,
                lifecycle=self.tiering,
            )
        await self.broker.start()
        self.delayed = DelayedService(
            self.broker,
            self.metrics,
            self.meta,
            objects=self.object_store,
            tier_prefix=self.config.tier.prefix,
            epoch=self.config.tier.epoch,
            schedule_deletion=None if self.tiering is None else self.tiering.deletions.schedule,
            tiering=self.tiering,
            config=SchedulerConfig(
                checkpoint_records=self.config.server.delayed_checkpoint_records
            ),
        )
        await self.delayed.start()
        self._register_stream_metrics(self.broker)
        self.metrics.consumer_buffer_bytes.read = _consumer_buffers(self.broker)
        loop = asyncio.get_running_loop()
        broker, config, metrics = self.broker, self.config, self.metrics
        s = config.server
        gate = Gatekeeper(config, metrics)
        tls_context = server_context(config.tls)
        if config.tls.plain_listener:
            self._server = await _listen(
                "server.port",
                s.host,
                s.port,
                loop.create_server(
                    lambda: Connection(broker, config, metrics, gate),
                    s.host,
                    s.port,
                    reuse_address=True,
                ),
            )
            stream_sockets = getattr(self._server, "sockets", None)
            assert stream_sockets
            self.stream_port = int(stream_sockets[0].getsockname()[1])
        if tls_context is not None:
            self._tls_server = await _listen(
                "tls.port",
                s.host,
                config.tls.port,
                loop.create_server(
                    lambda: Connection(broker, config, metrics, gate),
                    s.host,
                    config.tls.port,
                    reuse_address=True,
                    ssl=tls_context,
                    ssl_handshake_timeout=config.limits.handshake_timeout_seconds,
                ),
            )
            tls_sockets = getattr(self._tls_server, "sockets", None)
            assert tls_sockets
            self.tls_port = int(tls_sockets[0].getsockname()[1])
        guard = AdminGuard(config.auth, gate)
        degraded = self.tiering.degraded_streams if self.tiering else no_degraded_streams
        self.health = Health(self.broker, degraded)
        admin_app = build_admin_app(self.broker, self.metrics, guard, self.health)
        self.delayed.add_routes(admin_app, guard)
        add_cluster_routes(admin_app, guard, lambda: self.cluster)
        self._runner = web.AppRunner(admin_app, access_log=None)
        await self._runner.setup()
        admin_tls = (
            server_context(config.tls, client_certificates=False) if config.tls.admin else None
        )
        guard.scheme = "https" if admin_tls is not None else "http"
        site = web.TCPSite(
            self._runner, s.admin_host, s.admin_port, reuse_address=True, ssl_context=admin_tls
        )
        await _listen("server.admin_port", s.admin_host, s.admin_port, site.start())
        # the only way to learn the port of a port-0 bind (uvloop's Server too)
        sockets = getattr(site._server, "sockets", None)
        assert sockets
        self.admin_port = int(sockets[0].getsockname()[1])
        guard.port = self.admin_port
        self.health.listening = True
        broker_connections = self.broker.connections
        self.reloader = ConfigReloader(
            config,
            self._reload_config or (lambda: config),
            gate,
            guard,
            [c for c in (tls_context, admin_tls) if c is not None],
            lambda: list(broker_connections),
        )
        if config.cluster.enabled:
            self.cluster = ClusterService(config, self.meta, catalog)
            advertised = s.advertised_host or s.host
            await self.cluster.start(
                self.broker,
                f"{advertised}:{s.advertised_port or self.stream_port}",
                f"{s.admin_host}:{self.admin_port}",
            )
            self.cluster.leadership_hooks = self.delayed  # before its first directory scan
            watch_cluster(self.metrics, self.cluster)
            if self.object_store is not None:  # read anywhere: non-member streams
                self.non_member_reads = NonMemberReads(
                    config, catalog, self.object_store, self.cluster
                )
                self.non_member_reads.attach(self.broker)
        self.broker.open_streams()  # listening: now open the streams in the background
        if s.ready_file:
            self._write_ready_file(streams_opened=False)
            self._ready_task = asyncio.create_task(self._ready_when_opened())
        log.info(
            "server_started",
            version=tierlog.__version__,
            host=s.host,
            stream_port=self.stream_port,
            admin_port=self.admin_port,
            tls_port=self.tls_port,
            data_dir=storage.data_dir,
            object_store=redact_uri(storage.object_store) if config.tier.enabled else None,
            meta_store=redact_uri(storage.meta_store),
            tiering=config.tier.enabled and not config.reader.read_only,
            read_only=config.reader.read_only,
            loop=type(loop).__module__,
        )

    def _write_ready_file(self, *, streams_opened: bool) -> None:
        """The bound ports (once listening), and whether start-up has opened every
        stream (written again when it has)."""
        s = self.config.server
        tmp = s.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(
                {
                    "host": s.host,
                    "stream_port": self.stream_port,
                    "admin_port": self.admin_port,
                    "tls_port": self.tls_port,
                    "pid": os.getpid(),
                    "streams_opened": streams_opened,
                },
                f,
            )
        os.replace(tmp, s.ready_file)

    async def _ready_when_opened(self) -> None:
        await self.streams_opened()
        self._write_ready_file(streams_opened=True)

    def _register_stream_metrics(self, broker: Broker) -> None:
        """Per-stream values of the local tier, read from the open streams at scrape time."""
        metrics = self.metrics

        def per_stream(value: Callable[[StreamHandle], float]) -> Callable[[], list[Any]]:
            return lambda: [((h.vhost, h.name), float(value(h))) for h in broker.streams()]

        metrics.streams.read = lambda: [((), float(len(broker.streams())))]
        metrics.stream_local_bytes.read = per_stream(_local_bytes)
        metrics.stream_segments.read = per_stream(lambda h: len(h.log.segment_refs()))
        metrics.stream_next_offset.read = per_stream(lambda h: h.log.commit_point().next_offset)
        metrics.stream_queued_bytes.read = per_stream(lambda h: h.pending_bytes)
        metrics.publishers_throttled.read = per_stream(lambda h: bool(h.blocked))
        if self.tiering is None:
            metrics.tier_lag_bytes.read = per_stream(lambda h: h.tier_lag)

    def reload(self) -> bool:
        """SIGHUP: read the configuration again and apply users, permissions and TLS
        certificates; a failure keeps the running configuration (``ConfigReloader``)."""
        if self.reloader is None:
            log.warning("config_reload_failed", error="the server is not started")
            return False
        return self.reloader.reload()

    async def streams_opened(self, timeout: float | None = None) -> None:
        """Wait until start-up has tried to open every catalog stream (the listeners
        are open long before; a stream that failed stays ``failed`` in the admin API)."""
        assert self.broker is not None
        await asyncio.wait_for(self.broker.all_open.wait(), timeout)

    async def stop(self) -> None:
        """Stop listening, close connections, flush and close every stream."""
        await self._close()
        log.info("server_stopped")
        self._stopped.set()

    async def _close(self) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        if self.broker is not None:
            for conn in list(self.broker.connections):
                if conn.transport is not None:
                    conn.transport.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.cluster is not None:
            await self.cluster.detach()
        if self.delayed is not None:
            await self.delayed.close()
        if self.broker is not None:
            await self.broker.close()
        if self.cluster is not None:
            await self.cluster.close()
        if self.non_member_reads is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.non_member_reads.close)
        if self.tiering is not None:
            await self.tiering.close()
        if self.object_store is not None:
            self.object_store.close()
        if self.meta is not None:
            self.meta.close()
        self._lock.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard limit (thousands of streams: each
    open one holds its active segment's two files, subscriptions hold theirs)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=repr(exc))
            return
        log.info("open_files_limit_raised", soft=soft, hard=hard)


async def _open_store(what: str, setting: str, uri: str, open_store: Callable[[str], Any]) -> Any:
    """Open a store by URI off the event loop; failing to reach it is a startup error
    naming the store, the (redacted) URI and the setting."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, open_store, uri)
    except ConfigError as exc:
        raise ConfigError(f"{setting}: {exc}") from exc
    except ImportError:
        raise
    except (TierlogError, OSError, sqlite3.Error) as exc:
        raise StoreUnavailableError(
            f"cannot open the {what} {redact_uri(uri)} ({setting}): {_reason(exc)}"
        ) from exc


async def _listen(setting: str, host: str, port: int, bind: Coroutine[Any, Any, Any]) -> Any:
    """Await a listener's bind; failing to bind is a startup error naming the address and
    the setting."""
    try:
        return await bind
    except OSError as exc:
        env = "TIERLOG_" + setting.replace(".", "_").upper()
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else _reason(exc)
        raise ListenError(f"cannot listen on {host}:{port} ({setting} / {env}): {reason}") from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


async def _serve(config: ServerConfig, reload_config: Callable[[], ServerConfig] | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # before start-up: a signal during it stops (or is a reload request for) this server,
    # never the default action (SIGHUP's is to terminate the process uncleanly)
    hangups: list[int] = []
    loop.add_signal_handler(signal.SIGHUP, lambda: hangups.append(1))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = Server(config, reload_config=reload_config)
    await server.start()
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    if hangups:
        server.reload()
    await stop.wait()
    log.info("shutdown_requested")
    await server.stop()


def _consumer_buffers(broker: Broker) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
    """Bytes queued for consumers' sockets, all connections (each capped by the
    transport's write high-water mark plus one chunk)."""

    def read() -> list[tuple[tuple[str, ...], float]]:
        total = 0
        for conn in list(broker.connections):
            total += conn.unsent_bytes()
        return [((), float(total))]

    return read


def serve(config: ServerConfig, reload_config: Callable[[], ServerConfig] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the process exit code. SIGHUP calls
    ``reload_config`` (the configuration read again from its sources) and applies it."""
    setup_logging(config.server.log_format, config.server.log_level)
    tune_allocator()
    # The event loop shares the GIL with the writer, tiering and remote-read threads: a
    # thread asking for it waits until the holder blocks or the switch interval passes
    # (5 ms by default), and every confirm crosses it once or twice. A shorter interval
    # bounds what busy cold-read threads add to a hot publisher's confirm latency.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    if config.server.use_uvloop:
        try:
            import uvloop
        except ImportError:
            log.info("uvloop_unavailable")
        else:
            uvloop.run(_serve(config, reload_config))
            return 0
    asyncio.run(_serve(config, reload_config))
    return 0
