"""The soak's oracle can fail: each check, fed what a defect would produce (a confirmed
message missing, read twice or out of order, a delayed message early or lost, a resource
growing, an ERROR no fault explains, a watchdog report), reports it."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.soak.checks import Window, consumer_gaps, scan_logs, tally
from tests.soak.consumers import Delivery
from tests.soak.producers import SoakProducer
from tests.soak.report import SoakResult
from tests.soak.resources import ResourceSampler, Sample
from tests.soak.streams import BASE_ARGS, StreamSpec

PLAIN = StreamSpec("soak-rf3-0", "rf3", 3, BASE_ARGS, 1.0, 1)
DELAYED = StreamSpec("soak-delayed-0", "delayed", 3, BASE_ARGS, 1.0, 1, delayed=True)
RETAINED = StreamSpec("soak-retained-0", "retained", 3, BASE_ARGS, 1.0, 1, retained=True)


def producer(spec: StreamSpec, confirmed: range, due: dict[int, int] | None = None) -> Any:
    p = SoakProducer(None, spec, random.Random(1))  # type: ignore[arg-type]
    p.confirmed = set(confirmed)
    p.due_ms = dict(due or {})
    return p


def read(ids: list[int], ts: int = 0) -> list[Delivery]:
    return [Delivery(o, i, ts) for o, i in enumerate(ids)]


def test_a_clean_read_passes() -> None:
    t = tally(PLAIN, producer(PLAIN, range(1, 6)), {"n1": read([1, 2, 3, 4, 5, 6])})
    assert (t.lost, t.duplicated, t.out_of_order, t.problems) == (0, 0, 0, [])


def test_lost_duplicated_and_out_of_order_are_counted() -> None:
    p = producer(PLAIN, range(1, 6))
    assert tally(PLAIN, p, {"n1": read([1, 2, 4, 5])}).lost == 1
    assert tally(PLAIN, p, {"n1": read([1, 2, 3, 3, 4, 5])}).duplicated == 1
    assert tally(PLAIN, p, {"n1": read([1, 3, 2, 4, 5])}).out_of_order == 1
    # a loss seen through one member only is still a loss
    assert tally(PLAIN, p, {"n1": read([1, 2, 3, 4, 5]), "n2": read([1, 2, 3, 5])}).lost == 1


def test_delayed_early_and_lost() -> None:
    p = producer(DELAYED, range(1, 4), due={1: 1000, 2: 2000, 3: 3000})
    on_time = [Delivery(0, 2, 2000), Delivery(1, 1, 2500), Delivery(2, 3, 3001)]
    assert tally(DELAYED, p, {"c": on_time}).problems == []  # due order, not id order
    early = [Delivery(0, 1, 999), Delivery(1, 2, 2000), Delivery(2, 3, 3000)]
    assert tally(DELAYED, p, {"c": early}).delayed_early == 1
    assert tally(DELAYED, p, {"c": on_time[:2]}).delayed_lost == 1


def test_retention_may_drop_the_start_but_not_a_gap() -> None:
    p = producer(RETAINED, range(1, 11))
    assert tally(RETAINED, p, {"n1": read(list(range(5, 11)))}).problems == []
    assert tally(RETAINED, p, {"n1": read([5, 6, 8, 9, 10])}).lost == 1


def test_a_consumer_gap() -> None:
    assert consumer_gaps(PLAIN, producer(PLAIN, range(1, 11)), read([3, 4, 6, 7])) == 1


def test_growth_beyond_the_bound() -> None:
    nodes = {"n1": None}
    sampler = ResourceSampler(SimpleNamespace(nodes=nodes), {})  # type: ignore[arg-type]
    for t in range(100):
        disk = 1000 + 10 * t  # a disk that only grows
        sampler.samples.append(Sample(float(t), "n1", disk, 500, 50, 20))
    growth = sampler.growth(0.0, 100.0, 0.2)
    assert growth["disk"]["n1"] > 1.2
    assert growth["rss"]["n1"] == 1.0


def test_unexplained_errors_and_stalls(tmp_path: Path) -> None:
    log = tmp_path / "n1-server.log"
    log.write_text(
        "ts=2026-11-27T10:00:05.000Z level=error logger=x event=during_fault error=boom\n"
        "ts=2026-11-27T10:10:00.000Z level=error logger=x event=out_of_nowhere error=boom\n"
        "ts=2026-11-27T10:11:00.000Z level=error logger=x event=tiering_task_stalled\n"
    )
    process = SimpleNamespace(log_path=log)
    cluster = SimpleNamespace(nodes={"n1": SimpleNamespace(process=process)})
    start = 1795773600.0  # 2026-11-27T10:00:00Z
    scan = scan_logs(cluster, [Window("kill-leader", start, start + 10)], start)  # type: ignore[arg-type]
    assert dict(scan.explained) == {("during_fault", "kill-leader"): 1}
    assert len(scan.unexplained) == 1 and "out_of_nowhere" in scan.unexplained[0]
    assert len(scan.stalls) == 1


def test_the_report_line() -> None:
    result = SoakResult(seconds=7200.0, streams=20)
    result.tally.confirmed = 5
    line = result.line()
    assert line.startswith("soak hours=2.00 nodes=3 streams=20 confirmed=5 lost=0 duplicated=0")
    assert line.endswith("orphans=0")
