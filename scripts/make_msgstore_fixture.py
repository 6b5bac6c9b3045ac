"""Generate the real-RabbitMQ message-store fixture in tests/data/rabbitmq_msgstore/.

Starts a private RabbitMQ node (scripts/rabbitmq_node.py) with a small
``msg_store_file_size_limit`` (so the persistent message store spans several ``.rdq`` files),
declares a durable classic queue with ``x-queue-version`` 1, publishes persistent messages with
publisher confirms over AMQP 0-9-1 (``pika``), most of them above the 4 KiB
``queue_index_embed_msgs_below`` threshold so they land in the shared message store, a few
below it (embedded in the queue index, so absent from the store), then fetches every message
and acks a random subset. The node is stopped cleanly, which writes ``clean.dot`` and the
index file ``msg_store_index.ets``; the ``msg_store_persistent`` directory is copied next to
an ``expected.json`` that says which payloads are live and which were acked.

Acks do not touch ``.rdq`` files: an acked message's bytes stay in its file and only its
index entry's ref count drops to 0, which is what a reader must honour.

Usage: ``.venv/bin/python scripts/make_msgstore_fixture.py [--out tests/data/rabbitmq_msgstore]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pika
from rabbitmq_node import rabbitmq_node

QUEUE = "tierlog-msgstore-v1"
FILE_SIZE_LIMIT = 64 * 1024
EMBED_BELOW = 4096
MESSAGES = 36
SMALL_MESSAGES = 3
SEED = 20261124
MAX_FIXTURE_BYTES = 2 * 1024 * 1024


def _versions() -> str:
    """The Debian package versions of the node that wrote the fixture."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "rabbitmq-server", "erlang-base"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return ", ".join(out.split("\n")[:2]).strip(", ")


def _amqp_port(base: Path) -> int:
    for line in (base / "rabbitmq.conf").read_text().splitlines():
        if line.startswith("listeners.tcp.1"):
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError("no AMQP listener in rabbitmq.conf")


def _payload(rng: random.Random, index: int, size: int) -> bytes:
    prefix = b"tierlog-msgstore-%04d:" % index
    return prefix + rng.randbytes(size - len(prefix))


def _entry(index: int, payload: bytes) -> dict[str, object]:
    return {
        "index": index,
        "prefix": payload[:22].decode(),
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }


def generate(out: Path) -> None:
    rng = random.Random(SEED)
    payloads = [_payload(rng, i, rng.randint(4500, 12000)) for i in range(MESSAGES)]
    small = [_payload(rng, MESSAGES + i, rng.randint(100, 2000)) for i in range(SMALL_MESSAGES)]
    acked_indexes = set(rng.sample(range(MESSAGES), MESSAGES // 3))

    base = Path(tempfile.mkdtemp(prefix="tierlog-msgstore-rmq-"))
    try:
        # Written before the node starts: rabbitmq_node points RABBITMQ_ADVANCED_CONFIG_FILE here.
        (base / "advanced.config").write_text(
            f"[{{rabbit, [{{msg_store_file_size_limit, {FILE_SIZE_LIMIT}}},"
            f" {{queue_index_embed_msgs_below, {EMBED_BELOW}}}]}}].\n"
        )
        with rabbitmq_node(base) as node:
            params = pika.ConnectionParameters(
                host=node.host,
                port=_amqp_port(base),
                credentials=pika.PlainCredentials("guest", "guest"),
            )
            conn = pika.BlockingConnection(params)
            channel = conn.channel()
            channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-version": 1})
            channel.confirm_delivery()
            props = pika.BasicProperties(delivery_mode=2)
            for body in payloads + small:
                channel.basic_publish("", QUEUE, body, properties=props, mandatory=True)
            fetched: dict[bytes, int] = {}
            for _ in range(MESSAGES + SMALL_MESSAGES):
                method, _props, body = channel.basic_get(QUEUE, auto_ack=False)
                if method is None:
                    raise RuntimeError("queue drained early")
                fetched[body] = method.delivery_tag
            for i in sorted(acked_indexes):
                channel.basic_ack(fetched[payloads[i]])
            # Closing the channel requeues every fetched message that was not acked.
            channel.close()
            conn.close()
            data_dir = node.data_dir
        stores = list(data_dir.glob("msg_stores/vhosts/*/msg_store_persistent"))
        if len(stores) != 1:
            raise RuntimeError(f"expected one msg_store_persistent, found {stores}")
        store = stores[0]
        names = sorted(p.name for p in store.iterdir())
        if "msg_store_index.ets" not in names or "clean.dot" not in names:
            raise RuntimeError(f"node did not shut down cleanly: {names}")
        target = out / "msg_store_persistent"
        if target.exists():
            shutil.rmtree(target)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(store, target)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    total = sum(p.stat().st_size for p in target.iterdir())
    if total > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"fixture too large: {total} bytes")
    expected = {
        "rabbitmq": _versions(),
        "queue": QUEUE,
        "file_size_limit": FILE_SIZE_LIMIT,
        "rdq_files": sorted(p.name for p in target.glob("*.rdq")),
        "live": [_entry(i, p) for i, p in enumerate(payloads) if i not in acked_indexes],
        "acked": [_entry(i, p) for i, p in enumerate(payloads) if i in acked_indexes],
        "embedded_in_queue_index": [_entry(MESSAGES + i, p) for i, p in enumerate(small)],
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {target} ({total} bytes, {len(expected['rdq_files'])} .rdq files)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/data/rabbitmq_msgstore", type=Path)
    args = parser.parse_args()
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
