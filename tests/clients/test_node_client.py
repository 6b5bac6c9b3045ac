"""The official Node.js client (rabbitmq-stream-js-client, pinned in
tests/clients/node/package-lock.json) against ``tierlog serve``: publish with confirms,
deduplication of a named producer, every offset specification, super streams (create,
Route, Partitions, the client's super-stream publisher by key and by hash, consume, delete),
and the refusals of what tierlog does not serve yet (docs/compatibility.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.plugins.node_client import NODE_DIR, node_executable
from tests.plugins.tierlog_server import TierlogServerProcess

RUN_TIMEOUT_S = 60.0


def run_node_script(
    script: str, modules: Path, server: TierlogServerProcess, *args: str
) -> dict[str, object]:
    """Run ``tests/clients/node/<script>`` against ``server``; its JSON output."""
    env = dict(os.environ, TIERLOG_NODE_MODULES=str(modules))
    command = [node_executable(), str(NODE_DIR / script), server.host, str(server.stream_port)]
    done = subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_node_client_publishes_dedups_and_consumes_with_every_offset_spec(
    session_tierlog_server: TierlogServerProcess, node_client_modules: Path
) -> None:
    out = run_node_script("e2e.mjs", node_client_modules, session_tierlog_server, "node-e2e")
    assert out["server_version"] == "3.10.0"
    assert out["confirmed_first_batch"] == 100
    assert out["last_publishing_id"] == 110  # QueryPublisherSequence of the named producer
    assert out["duplicates_confirmed"] == 110  # confirmed, as RabbitMQ does ...
    assert out["publish_errors"] == []
    consumed = out["consumed"]
    assert isinstance(consumed, dict)
    stored = [[offset, f"m-{offset + 1}"] for offset in range(110)]
    assert consumed["first"] == stored  # ... and never stored twice
    assert consumed["offset_50"] == stored[50:]
    assert consumed["timestamp"] == stored[100:]  # published after the timestamp
    last = consumed["last"]
    # the last chunk: a suffix of the second batch (its chunking is the server's choice)
    assert last and last == stored[-len(last) :] and len(last) <= 10
    assert out["next_before_publish"] == 0
    assert consumed["next"] == [[110, "after-next-111"]]
    assert out["stats"] == {"first_chunk_id": 0, "committed_chunk_id": 110}
    refused = out["refused"]
    assert isinstance(refused, dict)
    # announced 3.10.0: the client itself refuses what tierlog does not serve yet
    assert "does not handle Create Super Stream" in refused["create_super_stream"]
    assert "does not support message filtering" in refused["filtering_publisher"]
    assert "does not support message filtering" in refused["filtering_consumer"]
    # super-stream queries of a super stream that does not exist: STREAM_DOES_NOT_EXIST
    assert "code 2" in refused["partitions"]
    assert "code 2" in refused["route"]
    assert "code 2" in refused["stats_of_missing_stream"]


def _murmur32_partition(key: str, partitions: list[str]) -> str:
    """The Node.js client's hash routing, recomputed here (murmur3 32-bit over UTF-8, seed
    104729, as ``dist/hash/murmur32.js``): the server stores no placement of its own."""
    import mmh3

    return partitions[mmh3.hash(key.encode(), 104729, signed=False) % len(partitions)]


def test_node_client_super_stream_create_route_publish_consume_delete(
    session_tierlog_server: TierlogServerProcess, node_client_modules: Path
) -> None:
    name = "node-ss"
    out = run_node_script("super_stream.mjs", node_client_modules, session_tierlog_server, name)
    parts = [f"{name}-eu", f"{name}-us", f"{name}-apac"]
    assert out["created"] is True
    assert out["second_create_code"] == 5  # STREAM_ALREADY_EXISTS
    assert out["partitions"] == parts
    assert out["route_us"] == [f"{name}-us"]
    assert out["route_none"] == []  # no binding key matches: OK, no stream
    assert "code 2" in str(out["partitions_of_missing"])
    seen = out["seen"]
    assert isinstance(seen, dict)
    for key in ("eu", "us", "apac"):  # by key: the server's Route answer
        assert all(seen[f"{key}:{i}"] == [f"{name}-{key}"] for i in range(30))
    for i in range(30):  # by hash: the client's own placement, each message read once
        key = f"customer-{i % 7}"
        assert seen[f"{key}:{i}"] == [_murmur32_partition(key, parts)]
    assert len(seen) == 4 * 30
    assert out["deleted"] is True
    assert "code 2" in str(out["partitions_after_delete"])
