"""Deliveries are paced per event-loop turn: a turn's budget is never exceeded by a
delivery that arrives after it is spent, waiters go in arrival order, cancelled waiters
are skipped, and nobody waits forever."""

from __future__ import annotations

import asyncio

import pytest

from tierlog.server.subscriptions import DeliveryTurns


async def _turn() -> None:
    """Let one loop turn pass."""
    await asyncio.sleep(0)


def test_deliveries_over_a_turns_budget_wait_for_the_next_turn_in_order() -> None:
    async def main() -> None:
        turns = DeliveryTurns(per_turn=100)
        log: list[tuple[int, int]] = []  # (turn, delivery)
        turn = 0

        async def deliver(i: int, n: int) -> None:
            await turns.take(n)
            log.append((turn, i))

        tasks = [asyncio.ensure_future(deliver(i, 60)) for i in range(5)]
        for turn in range(1, 8):  # noqa: B007 - read by deliver()
            await _turn()
            if all(t.done() for t in tasks):
                break
        await asyncio.gather(*tasks)
        order = [i for _t, i in log]
        assert order == [0, 1, 2, 3, 4]  # arrival order
        per_turn: dict[int, int] = {}
        for t, _i in log:
            per_turn[t] = per_turn.get(t, 0) + 1
        # 60-byte deliveries under a 100-byte budget: at most 2 per turn (the second one
        # starts while 60 < 100), so five take at least three turns
        assert max(per_turn.values()) <= 2
        assert len(per_turn) >= 3
        assert turns.deferred >= 3

    asyncio.run(main())


def test_a_cancelled_waiter_is_skipped_and_the_rest_proceed() -> None:
    async def main() -> None:
        turns = DeliveryTurns(per_turn=10)
        await turns.take(10)  # this turn is spent
        done: list[int] = []

        async def deliver(i: int) -> None:
            await turns.take(10)
            done.append(i)

        a = asyncio.ensure_future(deliver(1))
        b = asyncio.ensure_future(deliver(2))
        c = asyncio.ensure_future(deliver(3))
        await _turn()  # a new turn: the first delivery spends it, the others wait
        assert done == [1] and not b.done() and not c.done()
        b.cancel()
        await asyncio.wait_for(c, 5)
        with pytest.raises(asyncio.CancelledError):
            await b
        assert done == [1, 3]
        assert a.done()

    asyncio.run(main())


def test_a_chunk_larger_than_a_turn_still_goes_out() -> None:
    async def main() -> None:
        turns = DeliveryTurns(per_turn=10)
        await asyncio.wait_for(turns.take(1000), 1)
        await asyncio.wait_for(turns.take(1000), 1)  # next turn

    asyncio.run(main())
