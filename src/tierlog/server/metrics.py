"""A tiny dependency-free metrics registry rendering the Prometheus text format (0.0.4).

Counters and gauges are plain attribute updates (no locks: the server updates them
from its event loop; the writer threads only touch their own counters, and a torn
read of a float is impossible in CPython). Histograms keep cumulative buckets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

LabelKey = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in key]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text

    def samples(self) -> Iterable[str]:  # pragma: no cover - overridden
        return ()

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.samples())


class Counter(_Metric):
    """A monotonically increasing value, optionally per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help_text)
        self.values: dict[LabelKey, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def samples(self) -> Iterable[str]:
        if not self.values:
            yield f"{self.name} 0"
        for key, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(key)} {_num(value)}"


class Gauge(_Metric):
    """A value that goes up and down; ``source`` computes it at render time."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        source: Callable[[], Iterable[tuple[LabelKey, float]]] | None = None,
    ) -> None:
        super().__init__(name, help_text)
        self.values: dict[LabelKey, float] = {}
        self.source = source

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def value(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def samples(self) -> Iterable[str]:
        items = dict(self.values)
        if self.source is not None:
            items.update(self.source())
        if not items:
            yield f"{self.name} 0"
        for key, value in sorted(items.items()):
            yield f"{self.name}{_labels(key)} {_num(value)}"


class Histogram(_Metric):
    """Cumulative buckets, sum and count (no labels)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        super().__init__(name, help_text)
        self.bounds = sorted(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def samples(self) -> Iterable[str]:
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            yield f'{self.name}_bucket{{le="{_num(bound)}"}} {running}'
        yield f'{self.name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{self.name}_sum {_num(self.sum)}"
        yield f"{self.name}_count {self.count}"


class Registry:
    """Holds metrics by name; ``render()`` is the /metrics body."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help_text: str) -> Counter:
        metric = Counter(name, help_text)
        self._add(metric)
        return metric

    def gauge(
        self,
        name: str,
        help_text: str,
        source: Callable[[], Iterable[tuple[LabelKey, float]]] | None = None,
    ) -> Gauge:
        metric = Gauge(name, help_text, source)
        self._add(metric)
        return metric

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(name, help_text, buckets)
        self._add(metric)
        return metric

    def render(self) -> str:
        return "".join(m.render() for m in self._metrics.values())


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Every metric the server exposes, by attribute."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.connections = r.gauge("tierlog_connections", "Open stream-protocol connections.")
        self.connections_total = r.counter(
            "tierlog_connections_opened_total", "Stream-protocol connections accepted."
        )
        self.auth_failures = r.counter(
            "tierlog_auth_failures_total", "Failed SASL authentications."
        )
        self.published_messages = r.counter(
            "tierlog_published_messages_total", "Messages (publishing ids) received."
        )
        self.published_bytes = r.counter(
            "tierlog_published_bytes_total", "Entry bytes received in Publish frames."
        )
        self.confirmed_messages = r.counter(
            "tierlog_confirmed_messages_total", "Publishing ids confirmed."
        )
        self.duplicate_messages = r.counter(
            "tierlog_duplicate_messages_total", "Publishing ids dropped as duplicates (confirmed)."
        )
        self.publish_errors = r.counter(
            "tierlog_publish_errors_total", "Publishing ids answered with PublishError, by code."
        )
        self.chunks_written = r.counter("tierlog_chunks_written_total", "User chunks written.")
        self.fsyncs = r.counter("tierlog_group_commits_total", "Group commits (one fsync each).")
        self.group_frames = r.histogram(
            "tierlog_group_commit_frames",
            "Publish frames per group commit.",
            (1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.delivered_chunks = r.counter("tierlog_delivered_chunks_total", "Chunks delivered.")
        self.delivered_messages = r.counter(
            "tierlog_delivered_messages_total", "Records in delivered chunks."
        )
        self.delivered_bytes = r.counter(
            "tierlog_delivered_bytes_total", "Chunk bytes delivered (header + data)."
        )
        self.sendfile_chunks = r.counter(
            "tierlog_sendfile_chunks_total", "Chunks sent with sendfile."
        )
        self.subscriptions = r.gauge("tierlog_subscriptions", "Active subscriptions.")
        self.overtaken = r.counter(
            "tierlog_overtaken_consumers_total", "Consumers overtaken by retention, by action."
        )
        self.unreadable_data = r.counter(
            "tierlog_subscription_unreadable_data_total",
            "Subscriptions ended because the data at their position does not validate "
            "(corrupt local chunk, corrupt or vanished remote fragment), by kind.",
        )
        self.frame_errors = r.counter(
            "tierlog_frame_errors_total", "Connections closed for a bad frame, by reason."
        )
        self.unknown_commands = r.counter(
            "tierlog_unknown_commands_total", "Frames answered with UNKNOWN_FRAME."
        )
        self.throttled = r.gauge(
            "tierlog_publishers_throttled", "1 while a stream's publishers are throttled."
        )
        self.throttle_events = r.counter(
            "tierlog_throttle_events_total", "Times publishers were throttled (back-pressure)."
        )
        self.streams = r.gauge("tierlog_streams", "Streams open on this server.")
        self.stream_bytes: Gauge | None = None

    def render(self) -> str:
        return self.registry.render()
