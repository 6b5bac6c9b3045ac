"""An rstream single active consumer as applications write one: it stores the offset of
every message it handles, and when it becomes active it answers ConsumerUpdate with its
group's stored offset + 1 (first when nothing is stored yet). Shared by the tests in
``test_sac_rstream.py`` and, run as a script, the consumer process they kill:

    python -m tests.clients.sac_rstream <host> <port> <stream> <name> <out-file>

which appends each handled offset to <out-file> (one per line, after storing it).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetNotFound,
    OffsetSpecification,
    OffsetType,
)
from rstream.consumer import EventContext


async def stored_offset(consumer: Consumer, stream: str, name: str) -> int | None:
    try:
        return await consumer.query_offset(stream, name)
    except OffsetNotFound:
        return None


async def sac_consumer(
    host: str, port: int, stream: str, name: str, handled: Callable[[int], None]
) -> Consumer:
    """A started consumer of group ``name``; ``handled(offset)`` after each message's
    offset is stored."""
    consumer = Consumer(host=host, port=port, username="guest", password="guest")
    await consumer.start()

    async def on_message(_message: AMQPMessage, context: MessageContext) -> None:
        await context.consumer.store_offset(stream, name, context.offset)
        handled(context.offset)

    async def on_update(active: bool, context: EventContext) -> OffsetSpecification:
        if not active:
            return OffsetSpecification(OffsetType.NEXT, 0)
        stored = await stored_offset(context.consumer, stream, name)
        if stored is None:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)

    await consumer.subscribe(
        stream,
        on_message,
        offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        properties={"single-active-consumer": "true", "name": name},
        consumer_update_listener=on_update,
    )
    return consumer


async def _main(host: str, port: str, stream: str, name: str, out: str) -> None:
    with open(out, "a", buffering=1) as sink:
        await sac_consumer(host, int(port), stream, name, lambda o: print(o, file=sink))
        print("subscribed", flush=True)
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:6]))
