"""The official Node.js client (rabbitmq-stream-js-client, pinned in
tests/clients/node/package-lock.json) against ``tierlog serve``: publish with confirms,
deduplication of a named producer, every offset specification, and the refusals of what
tierlog does not serve yet (docs/compatibility.md)."""

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
    # super-stream queries: the server's unknown-command code (13), a clean error
    assert "code 13" in refused["partitions"]
    assert "code 13" in refused["route"]
    assert "code 2" in refused["stats_of_missing_stream"]
