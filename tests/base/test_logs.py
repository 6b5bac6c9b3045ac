"""Structured logs: each event is one line, real JSON with its fields under
``log_format="json"``, logfmt with quoted values under ``kv``; the server's startup line
carries the version and the store URIs with credentials redacted; a served process writes
nothing but such lines."""

from __future__ import annotations

import io
import json
import logging
import shlex
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import tierlog
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_inprocess import _config
from tierlog.logs import get_logger, redact_uri, setup_logging
from tierlog.server.app import Server


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """setup_logging into a buffer; the root logger's handlers and levels restored after."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("tierlog").level)
    stream = io.StringIO()
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("tierlog").setLevel(saved[2])
        setup_logging_kv_default()


def setup_logging_kv_default() -> None:
    # back to the default renderer without installing a handler
    from tierlog import logs

    logs._render.renderer = logs._kv_renderer()


def test_json_lines_carry_the_fields(captured: io.StringIO) -> None:
    setup_logging("json", "debug", captured)
    log = get_logger("tierlog.test")
    log.info("segment_rolled", stream="orders", segment=42, sealed=True, ratio=0.5)
    log.debug("detail", items=[1, 2], error=ValueError("bad value"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("task_failed", stream="orders")
    logging.getLogger("aiohttp.server").warning("foreign %s", "message")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [line["event"] for line in lines] == [
        "segment_rolled",
        "detail",
        "task_failed",
        "foreign message",
    ]
    first = lines[0]
    assert first["stream"] == "orders" and first["segment"] == 42 and first["sealed"] is True
    assert first["level"] == "info" and first["logger"] == "tierlog.test"
    assert first["ts"].endswith("Z") and first["ratio"] == 0.5
    assert lines[1]["items"] == [1, 2] and lines[1]["error"] == "ValueError('bad value')"
    assert lines[2]["level"] == "error" and "RuntimeError: boom" in lines[2]["exception"]
    assert lines[3]["logger"] == "aiohttp.server" and lines[3]["level"] == "warning"


def test_kv_lines_quote_values(captured: io.StringIO) -> None:
    setup_logging("kv", "info", captured)
    log = get_logger("tierlog.test")
    log.info("connection_closed", reason="bad frame", peer="10.0.0.1", detail='say "hi"\nbye')
    log.debug("hidden_at_info")
    (line,) = captured.getvalue().splitlines()
    fields = dict(part.split("=", 1) for part in shlex.split(line))
    assert fields["event"] == "connection_closed"
    assert fields["level"] == "info" and fields["logger"] == "tierlog.test"
    assert fields["reason"] == "bad frame" and fields["peer"] == "10.0.0.1"
    assert '\\"hi\\"' in line and "\\n" in line  # one line, quotes escaped
    assert line.index("ts=") < line.index("level=") < line.index("event=") < line.index("reason=")


def test_bad_format_or_level_rejected() -> None:
    with pytest.raises(ValueError, match="log format"):
        setup_logging("xml", "info")
    with pytest.raises(ValueError, match="log level"):
        setup_logging("json", "verbose")


def test_redact_uri() -> None:
    assert redact_uri("etcd://root:s3cret@etcd:2379/tierlog") == "etcd://root:***@etcd:2379/tierlog"
    assert (
        redact_uri("s3://bucket/p?endpoint=http://h:8333&secret_access_key=abc&region=eu")
        == "s3://bucket/p?endpoint=http://h:8333&secret_access_key=***&region=eu"
    )
    assert redact_uri("file:///var/lib/tierlog/objects") == "file:///var/lib/tierlog/objects"
    assert redact_uri("etcd://user@etcd:2379/x") == "etcd://user@etcd:2379/x"


async def test_startup_line_has_version_and_store_uris(
    tmp_path: Path, captured: io.StringIO
) -> None:
    setup_logging("json", "info", captured)
    server = Server(_config(tmp_path))
    await server.start()
    await server.stop()
    events = {e["event"]: e for e in map(json.loads, captured.getvalue().splitlines())}
    started = events["server_started"]
    assert started["version"] == tierlog.__version__
    assert started["stream_port"] == server.stream_port
    assert started["object_store"] == server.storage.object_store
    assert started["meta_store"] == server.storage.meta_store
    assert "server_stopped" in events


def test_served_process_writes_json_events_only(tmp_path: Path) -> None:
    server = TierlogServerProcess(
        tmp_path / "data", env={"TIERLOG_SERVER_LOG_FORMAT": "json"}
    ).start()
    try:
        body = json.dumps({"name": "audit", "vhost": "/"}).encode()
        request = urllib.request.Request(
            server.admin_url + "/api/streams", data=body, method="POST"
        )
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        assert urllib.request.urlopen(request, timeout=10).status == 201
        delete = urllib.request.Request(server.admin_url + "/api/streams/audit", method="DELETE")
        delete.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        assert urllib.request.urlopen(delete, timeout=10).status == 200
    finally:
        assert server.stop() == 0
    lines = [json.loads(line) for line in server.log_tail(100_000).splitlines()]
    by_event = {line["event"]: line for line in lines}
    assert {"server_started", "stream_opened", "stream_deleted", "server_stopped"} <= set(by_event)
    assert by_event["stream_opened"]["stream"] == "audit"
    assert by_event["stream_opened"]["vhost"] == "/"
    assert by_event["stream_deleted"]["incarnation"] == by_event["stream_opened"]["incarnation"]
    assert by_event["server_started"]["version"] == tierlog.__version__
    assert all({"ts", "level", "logger", "event"} <= set(line) for line in lines)
