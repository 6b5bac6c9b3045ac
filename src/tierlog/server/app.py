"""``tierlog serve``: wire config, stores, catalog, broker, protocol and admin listeners.

``Server`` runs inside an event loop (tests start it in-process); ``serve()`` is the
command: uvloop when available, structured log lines, SIGTERM / SIGINT stop it
cleanly (listeners closed, queued publishes written, logs fsynced and closed), and a
restart resumes from the same data directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from aiohttp import web

from tierlog.server.admin import build_admin_app
from tierlog.server.broker import Broker, LagProvider, RemoteStatusProvider, no_lag
from tierlog.server.config import ServerConfig
from tierlog.server.connection import Connection
from tierlog.server.metrics import ServerMetrics
from tierlog.server.tiering_service import TieringService
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.retry import RETRY_LOG
from tierlog.storage.startup import open_meta_store_for_startup, open_object_store_for_startup
from tierlog.tiering.catalog import Catalog

log = logging.getLogger("tierlog.server")


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=… logger=… msg`` lines; messages are already ``key=value`` pairs."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def setup_logging(config: ServerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.server.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("tierlog")
    root.handlers[:] = [handler]
    root.setLevel(config.server.log_level.upper())
    root.propagate = False


class Server:
    """A running tierlog server (stream protocol + admin HTTP) inside the current loop."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        lag_provider: LagProvider = no_lag,
        remote_status: RemoteStatusProvider | None = None,
    ) -> None:
        self.config = config
        self.storage = config.storage.resolved()
        self.metrics = ServerMetrics()
        self.meta: MetaStore | None = None
        self.object_store: ObjectStore | None = None
        self.tiering: TieringService | None = None
        self.broker: Broker | None = None
        self._lag_provider = lag_provider
        self._remote_status = remote_status
        self._server: asyncio.AbstractServer | None = None
        self._runner: web.AppRunner | None = None
        self.stream_port = 0
        self.admin_port = 0
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        os.makedirs(self.storage.data_dir, exist_ok=True)
        loop = asyncio.get_running_loop()
        # start-up rides out a flaky store: retried up to store.startup_deadline_seconds
        store = self.config.store
        RETRY_LOG.configure(store.retry_warning_interval_seconds, store.retry_warnings_per_interval)
        policy, deadline = store.retry_policy(), store.startup_deadline_seconds
        self.meta = await loop.run_in_executor(
            None, open_meta_store_for_startup, self.storage.meta_store, policy, deadline
        )
        catalog = Catalog(self.meta)
        lag_provider, remote_status = self._lag_provider, self._remote_status
        if self.config.tier.enabled:
            self.object_store = await loop.run_in_executor(
                None, open_object_store_for_startup, self.storage.object_store, policy, deadline
            )
            self.tiering = TieringService(self.config, self.object_store, catalog, self.metrics)
            await self.tiering.start()
            if lag_provider is no_lag:
                lag_provider = self.tiering.lag
            if remote_status is None:
                remote_status = self.tiering
        self.broker = Broker(
            self.config,
            catalog,
            self.metrics,
            lag_provider=lag_provider,
            remote_status=remote_status,
            lifecycle=self.tiering,
        )
        await self.broker.start()
        loop = asyncio.get_running_loop()
        broker, config, metrics = self.broker, self.config, self.metrics
        s = config.server
        self._server = await loop.create_server(
            lambda: Connection(broker, config, metrics), s.host, s.port, reuse_address=True
        )
        stream_sockets = getattr(self._server, "sockets", None)
        assert stream_sockets
        self.stream_port = int(stream_sockets[0].getsockname()[1])
        self._runner = web.AppRunner(build_admin_app(self.broker, self.metrics), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.admin_host, s.admin_port, reuse_address=True)
        await site.start()
        # the only way to learn the port of a port-0 bind (uvloop's Server too)
        sockets = getattr(site._server, "sockets", None)
        assert sockets
        self.admin_port = int(sockets[0].getsockname()[1])
        if s.ready_file:
            tmp = s.ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(
                    {
                        "host": s.host,
                        "stream_port": self.stream_port,
                        "admin_port": self.admin_port,
                        "pid": os.getpid(),
                    },
                    f,
                )
            os.replace(tmp, s.ready_file)
        log.info(
            "event=listening stream_port=%d admin_port=%d data_dir=%s loop=%s",
            self.stream_port,
            self.admin_port,
            self.storage.data_dir,
            type(loop).__module__,
        )

    async def stop(self) -> None:
        """Stop listening, close connections, flush and close every stream."""
        if self._server is not None:
            self._server.close()
        if self.broker is not None:
            for conn in list(self.broker.connections):
                if conn.transport is not None:
                    conn.transport.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.broker is not None:
            await self.broker.close()
        if self.tiering is not None:
            await self.tiering.close()
        if self.object_store is not None:
            self.object_store.close()
        if self.meta is not None:
            self.meta.close()
        log.info("event=stopped")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def _serve(config: ServerConfig) -> None:
    server = Server(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("event=shutdown_requested")
    await server.stop()


def serve(config: ServerConfig) -> int:
    """Run the server until SIGTERM/SIGINT; returns the process exit code."""
    setup_logging(config)
    if config.server.use_uvloop:
        try:
            import uvloop
        except ImportError:
            log.info("event=uvloop_unavailable")
        else:
            uvloop.run(_serve(config))
            return 0
    asyncio.run(_serve(config))
    return 0
