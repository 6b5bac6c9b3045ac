"""Metrics: a live scrape parsed back with prometheus_client's parser matches
docs/metrics.md (every family, its type, its labels), counters and only counters end in
``_total``, per-stream series are labelled by stream name, each server has its own
registry, and the object-store wrapper records latency, sizes and outcomes."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.server.test_inprocess import AsyncRawClient, _config
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.metrics import Metrics
from tierlog.server.app import Server
from tierlog.storage.errors import NotFoundError
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.metered_object_store import MeteredObjectStore

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\|")


def documented() -> dict[str, tuple[str, set[str]]]:
    """Family name (as the parser reports it) -> (type, label names), from docs/metrics.md."""
    out: dict[str, tuple[str, set[str]]] = {}
    for line in DOCS.read_text().splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        name, kind = m["name"], m["type"]
        labels = set(re.findall(r"`([a-z_]+)`", m["labels"]))
        family = name.removesuffix("_total") if kind == "counter" else name
        assert family not in out, f"{name} documented twice"
        out[family] = (kind, labels)
    assert len(out) > 40
    return out


def parse(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {f.name: (f.type, list(f.samples)) for f in text_string_to_metric_families(text)}


def sample_value(
    families: dict[str, tuple[str, list[Sample]]], name: str, **labels: str
) -> float | None:
    for _, samples in families.values():
        for s in samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(_config(tmp_path))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def scrape(server: Server) -> str:
    url = f"http://127.0.0.1:{server.admin_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


async def publish_and_consume(server: Server, stream: str, count: int) -> AsyncRawClient:
    client = await AsyncRawClient.connect(server.stream_port)
    arguments = {"x-tierlog-max-fragment-age": "1s", "x-tierlog-debounce-seconds": "0.1"}
    created = await client.request(c.CreateRequest(client.next_corr(), stream, arguments))
    assert created.response_code == ResponseCode.OK
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", stream))
    client.send(encode_publish(1, [(i, b"m%d" % i) for i in range(1, count + 1)]))
    confirm = await client.expect(PublishConfirm)
    assert len(confirm.publishing_ids) == count
    sub = c.SubscribeRequest(client.next_corr(), 7, stream, c.WireOffsetSpec(OffsetType.FIRST), 10)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    await client.expect(Deliver)
    return client


async def test_scrape_matches_the_documented_families(server: Server) -> None:
    client = await publish_and_consume(server, "orders", 20)
    families = parse(await scrape(server))
    docs = documented()
    for family, (kind, labels) in docs.items():
        assert family in families, f"{family} documented but not exposed"
        exposed_kind, samples = families[family]
        assert exposed_kind == kind, f"{family}: exposed as {exposed_kind}, documented {kind}"
        for s in samples:
            assert set(s.labels) - {"le"} <= labels, f"{s.name}: labels {s.labels}"
    assert set(families) - set(docs) == set(), "exposed but not documented"
    for family, (kind, samples) in families.items():
        if kind != "counter":
            assert not any(s.name.endswith("_total") for s in samples), family
    assert sample_value(families, "tierlog_build_info") == 1
    assert sample_value(families, "tierlog_published_messages_total") == 20
    assert sample_value(families, "tierlog_confirmed_messages_total") == 20
    assert sample_value(families, "tierlog_publish_confirm_seconds_count") == 1
    assert sample_value(families, "tierlog_subscriptions") == 1
    assert sample_value(families, "tierlog_delivered_messages_total") == 20
    assert sample_value(families, "tierlog_process_cpu_seconds_total") is None
    assert sample_value(families, "process_cpu_seconds_total") is not None
    client.close()


async def test_per_stream_series_are_labelled_by_stream_name(server: Server) -> None:
    client = await publish_and_consume(server, "orders", 20)
    assert server.broker is not None
    handle = server.broker.get("/", "orders")
    assert handle is not None
    incarnation = handle.record.incarnation
    assert incarnation != "orders"
    deadline = time.monotonic() + 30
    while True:  # the fragment is cut after 1 s, committed 0.1 s later
        text = await scrape(server)
        families = parse(text)
        remote = sample_value(families, "tierlog_remote_next_offset", stream="orders")
        lag = sample_value(families, "tierlog_tier_lag_bytes", stream="orders")
        # chunks written after the records (tracking) may still be on their way
        if (remote == 20 and lag == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert remote == 20, text
    assert incarnation not in text
    labels = {"vhost": "/", "stream": "orders"}
    for name in (
        "tierlog_stream_next_offset",
        "tierlog_stream_segments",
        "tierlog_stream_local_bytes",
        "tierlog_tier_lag_bytes",
        "tierlog_publishers_throttled",
        "tierlog_tiering_halted",
        "tierlog_manifest_commits_total",
    ):
        assert sample_value(families, name, **labels) is not None, name
    assert sample_value(families, "tierlog_stream_next_offset", **labels) == 20
    assert sample_value(families, "tierlog_tier_lag_bytes", **labels) == 0
    assert sample_value(families, "tierlog_tiering_halted", **labels) == 0
    assert (sample_value(families, "tierlog_manifest_commits_total", **labels) or 0) >= 1
    assert (sample_value(families, "tierlog_manifest_commit_seconds_count") or 0) >= 1
    uploads = sample_value(families, "tierlog_upload_seconds_count", op="put_if_absent")
    assert uploads is not None and uploads >= 2  # fragment + root
    ok = sample_value(
        families, "tierlog_object_store_requests_total", op="put_if_absent", outcome="ok"
    )
    assert ok == uploads
    client.close()
    # Deleted and re-created: a new incarnation, the same series.
    assert server.broker is not None
    await server.broker.delete_stream("/", "orders")
    families = parse(await scrape(server))
    assert sample_value(families, "tierlog_stream_next_offset", stream="orders") is None
    client = await publish_and_consume(server, "orders", 5)
    families = parse(await scrape(server))
    assert sample_value(families, "tierlog_stream_next_offset", **labels) == 5
    client.close()


async def test_each_server_has_its_own_registry(tmp_path: Path) -> None:
    first = Server(_config(tmp_path / "a"))
    second = Server(_config(tmp_path / "b"))
    await first.start()
    await second.start()
    try:
        client = await publish_and_consume(first, "s", 3)
        assert first.metrics.value("tierlog_published_messages_total") == 3
        assert second.metrics.value("tierlog_published_messages_total") == 0
        assert parse(await scrape(second))["tierlog_streams"][1][0].value == 0
        client.close()
    finally:
        await first.stop()
        await second.stop()


def test_metered_store_records_latency_sizes_and_outcomes(tmp_path: Path) -> None:
    metrics = Metrics()
    store = MeteredObjectStore(FsObjectStore(tmp_path), metrics)
    store.put_if_absent("a", b"x" * 5000)
    store.put("b", b"y" * 10)
    assert store.get("a") == b"x" * 5000
    assert store.get_suffix("a", 100) == b"x" * 100
    assert bytes(store.get_view("a", 0, 10)) == b"x" * 10
    with pytest.raises(NotFoundError):
        store.get("missing")
    v = metrics.value
    assert v("tierlog_upload_seconds_count", op="put_if_absent") == 1
    assert v("tierlog_upload_seconds_count", op="put") == 1
    assert v("tierlog_object_store_uploaded_bytes_total") == 5010
    assert v("tierlog_remote_read_seconds_count") == 4  # the failed GET too
    assert v("tierlog_remote_get_bytes_count") == 3
    assert v("tierlog_remote_get_bytes_sum") == 5110
    assert v("tierlog_remote_get_bytes_bucket", le="1024.0") == 2
    assert v("tierlog_object_store_downloaded_bytes_total") == 5110
    assert v("tierlog_object_store_requests_total", op="get", outcome="ok") == 3
    assert v("tierlog_object_store_requests_total", op="get", outcome="NotFoundError") == 1


async def test_openmetrics_when_the_scraper_asks(server: Server) -> None:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )

    url = f"http://127.0.0.1:{server.admin_port}/metrics"
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    async with aiohttp.ClientSession() as http, http.get(url, headers={"Accept": accept}) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await r.text()
    families = {f.name: f.type for f in openmetrics_families(text)}
    assert families["tierlog_published_messages"] == "counter"
    assert families["tierlog_publish_confirm_seconds"] == "histogram"
    assert families["tierlog_build"] == "info"
