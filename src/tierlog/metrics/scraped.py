"""Metric families read from live objects at scrape time (the machinery behind
``Metrics._scrape``; the families themselves are declared in ``tierlog.metrics``).

Values that already live in the running objects (per-stream sizes, lags, offsets,
replication counters) are not copied into gauges on every change: a ``Scraped`` family's
``read`` callable, set by the owner of the values, runs at scrape time on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

STREAM_LABELS = ("vhost", "stream")
"""Per-stream families' labels: the stream's *name*, never its incarnation."""

ScrapedSample = tuple[tuple[str, ...], float]
"""Label values (in the family's label order) and the value."""


def _nothing() -> Iterable[ScrapedSample]:
    return ()


@dataclass(eq=False)
class Scraped:
    """A family whose samples are read from live objects at scrape time.

    ``read`` returns ``(label values, value)`` pairs; until an owner sets it the family is
    exposed with no samples (its HELP and TYPE still tell what will be there).
    """

    name: str
    documentation: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...] = ()
    read: Callable[[], Iterable[ScrapedSample]] = _nothing

    def empty(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def family(self) -> Metric:
        family = self.empty()
        for values, value in self.read():
            family.add_metric(list(values), value)
        return family


class ScrapedCollector(Collector):
    """Registers a list of ``Scraped`` families (appended to until the first scrape)."""

    def __init__(self, families: list[Scraped]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for scraped in self.families:
            yield scraped.family()

    def describe(self) -> Iterator[Metric]:
        for scraped in self.families:
            yield scraped.empty()
