"""Every metric tierlog exposes, declared once, on ``prometheus_client``.

A ``Metrics`` owns one ``CollectorRegistry``: each server has its own (tests run several
servers in one process), and the admin API's ``/metrics`` serves ``metrics.exposition()``.
Components receive the ``Metrics`` of the server they belong to and update its attributes
directly (``metrics.published_messages.inc(n)``,
``metrics.publish_errors.labels(code="2").inc()``, ``with metrics.remote_read_seconds.time():``).

Values that already live in the running objects (per-stream sizes, lags, offsets, counts
kept by a tierer) are not copied into gauges on every change: they are ``Scraped``
families whose ``read`` callable the owner of the values sets, and which run at scrape
time on the event loop (``tierlog.metrics.scraped``). Per-stream families are labelled
``vhost`` and ``stream`` by stream *name* (an incarnation directory changes when a stream
is re-created; a dashboard must not).

The cluster's families are declared in ``tierlog.metrics.cluster`` (``metrics.cluster``).

To add a metric: declare it in ``Metrics.__init__`` (counters without ``_total``:
prometheus_client adds it), record into it where the event happens, and document it in
docs/metrics.md (a test checks that the two lists agree).
"""

from __future__ import annotations

from typing import Literal

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

import tierlog
from tierlog.metrics.cluster import ClusterFamilies
from tierlog.metrics.scraped import STREAM_LABELS, Scraped, ScrapedCollector

# ``*_created`` series double every counter for no use here; the switch is process-wide.
prometheus_client.disable_created_metrics()

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Seconds, from half a millisecond (fsync on fast disks) to object-store timeouts."""

SIZE_BUCKETS = tuple(float(1 << k) for k in range(10, 31, 2))
"""Bytes: 1 KiB (trailers, index reads) to 1 GiB (the largest fragment), by factors of 4."""

FRAME_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """One server's metrics: one registry, every metric an attribute."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self._scraped: list[Scraped] = []

        # -- process and build ------------------------------------------------------
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build = Info("tierlog_build", "tierlog build: version.", registry=r)
        self.build.info({"version": tierlog.__version__})

        # -- connections ------------------------------------------------------------
        self.connections = Gauge(
            "tierlog_connections", "Open stream-protocol connections.", registry=r
        )
        self.connections_opened = Counter(
            "tierlog_connections_opened", "Stream-protocol connections accepted.", registry=r
        )
        self.auth_failures = Counter(
            "tierlog_auth_failures", "Failed SASL authentications.", registry=r
        )
        self.frame_errors = Counter(
            "tierlog_frame_errors",
            "Connections closed for a bad frame, by reason.",
            ["reason"],
            registry=r,
        )
        self.access_refused = Counter(
            "tierlog_access_refused",
            "Requests refused by authorisation, by interface (stream, admin) and action.",
            ["interface", "action"],
            registry=r,
        )
        self.limits_hit = Counter(
            "tierlog_limits_hit",
            "Resource limits reached (connections refused or paused, handshakes timed out).",
            ["limit"],
            registry=r,
        )
        self.unknown_commands = Counter(
            "tierlog_unknown_commands", "Frames answered with UNKNOWN_FRAME.", registry=r
        )

        # -- publishing -------------------------------------------------------------
        self.published_messages = Counter(
            "tierlog_published_messages", "Messages (publishing ids) received.", registry=r
        )
        self.published_bytes = Counter(
            "tierlog_published_bytes", "Bytes of Publish frames received.", registry=r
        )
        self.confirmed_messages = Counter(
            "tierlog_confirmed_messages", "Publishing ids confirmed.", registry=r
        )
        self.duplicate_messages = Counter(
            "tierlog_duplicate_messages",
            "Publishing ids dropped as duplicates (and confirmed).",
            registry=r,
        )
        self.publish_errors = Counter(
            "tierlog_publish_errors",
            "Publishing ids answered with PublishError, by response code.",
            ["code"],
            registry=r,
        )
        self.publish_confirm_seconds = Histogram(
            "tierlog_publish_confirm_seconds",
            "Time from a Publish frame's arrival to its confirm (written and fsynced).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.throttle_events = Counter(
            "tierlog_throttle_events",
            "Times a connection's publishers were throttled (back-pressure).",
            registry=r,
        )

        # -- local log --------------------------------------------------------------
        self.chunks_written = Counter("tierlog_chunks_written", "User chunks written.", registry=r)
        self.group_commits = Counter(
            "tierlog_group_commits", "Group commits (one fsync each).", registry=r
        )
        self.group_commit_frames = Histogram(
            "tierlog_group_commit_frames",
            "Publish frames per group commit.",
            buckets=FRAME_BUCKETS,
            registry=r,
        )

        # -- consuming --------------------------------------------------------------
        self.subscriptions = Gauge("tierlog_subscriptions", "Active subscriptions.", registry=r)
        self.delivered_chunks = Counter(
            "tierlog_delivered_chunks", "Chunks delivered to consumers.", registry=r
        )
        self.delivered_messages = Counter(
            "tierlog_delivered_messages", "Records in delivered chunks.", registry=r
        )
        self.delivered_bytes = Counter(
            "tierlog_delivered_bytes", "Chunk bytes delivered (header and data).", registry=r
        )
        self.sendfile_chunks = Counter(
            "tierlog_sendfile_chunks", "Chunks sent with sendfile.", registry=r
        )
        self.overtaken = Counter(
            "tierlog_overtaken_consumers",
            "Consumers overtaken by retention, by the action taken (notify or skip).",
            ["action"],
            registry=r,
        )
        self.unreadable_data = Counter(
            "tierlog_subscription_unreadable_data",
            "Subscriptions ended because the data at their position does not validate "
            "(corrupt local chunk, corrupt or vanished remote fragment), by kind.",
            ["kind"],
            registry=r,
        )

        # -- local damage (found by recovery when a stream opens) -------------------
        self.local_damage_repaired = Counter(
            "tierlog_local_damage_repaired",
            "Damaged local segments rewritten from the committed remote fragments.",
            STREAM_LABELS,
            registry=r,
        )
        self.local_damage_refused = Counter(
            "tierlog_local_damage_refused",
            "Streams refused because a local segment is damaged and no healthy copy exists "
            "(the file is moved aside as *.damaged).",
            STREAM_LABELS,
            registry=r,
        )

        # -- object store (recorded by the metered store wrapper) -------------------
        self.object_store_requests = Counter(
            "tierlog_object_store_requests",
            "Object store requests by operation and outcome (ok or the error class).",
            ["op", "outcome"],
            registry=r,
        )
        self.object_store_uploaded_bytes = Counter(
            "tierlog_object_store_uploaded_bytes",
            "Bytes uploaded to the object store (fragments and manifest objects).",
            registry=r,
        )
        self.object_store_downloaded_bytes = Counter(
            "tierlog_object_store_downloaded_bytes",
            "Bytes read from the object store.",
            registry=r,
        )
        self.upload_seconds = Histogram(
            "tierlog_upload_seconds",
            "Latency of one object upload (put or create-only put), successful or not.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.remote_read_seconds = Histogram(
            "tierlog_remote_read_seconds",
            "Latency of one object-store GET (whole, ranged or suffix), successful or not.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.remote_get_bytes = Histogram(
            "tierlog_remote_get_bytes",
            "Bytes returned by one object-store GET.",
            buckets=SIZE_BUCKETS,
            registry=r,
        )

        # -- tiering ----------------------------------------------------------------
        self.manifest_commit_seconds = Histogram(
            "tierlog_manifest_commit_seconds",
            "Latency of one manifest commit (root PUT and conditional pointer update).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        # -- garbage collection (server/gc_service.py) ------------------------------
        self.gc_deleted_objects = Counter(
            "tierlog_gc_deleted_objects",
            "Remote objects deleted by this server's garbage collection.",
            registry=r,
        )
        self.gc_deleted_bytes = Counter(
            "tierlog_gc_deleted_bytes",
            "Bytes of the remote objects deleted by this server's garbage collection.",
            registry=r,
        )
        self.gc_aborted_uploads = Counter(
            "tierlog_gc_aborted_uploads",
            "Incomplete multipart uploads older than the grace period aborted by gc.",
            registry=r,
        )
        self.gc_skipped_streams = Counter(
            "tierlog_gc_skipped_streams",
            "Streams a collection left alone: their manifest could not be read completely.",
            registry=r,
        )
        self.gc_runs = Counter(
            "tierlog_gc_runs", "Garbage collections run, by outcome.", ["outcome"], registry=r
        )
        self.gc_last_run_timestamp = Gauge(
            "tierlog_gc_last_run_timestamp_seconds",
            "When the last complete garbage collection ended (seconds since the epoch).",
            registry=r,
        )
        self.gc_last_run_seconds = Gauge(
            "tierlog_gc_last_run_seconds",
            "How long the last complete garbage collection took.",
            registry=r,
        )

        # -- read at scrape time ----------------------------------------------------
        self.streams = self._scrape("tierlog_streams", "Streams open on this server.", "gauge")
        self.stream_local_bytes = self._scrape_stream(
            "tierlog_stream_local_bytes", "Bytes of the stream's local segment and index files."
        )
        self.stream_segments = self._scrape_stream(
            "tierlog_stream_segments", "Local segment files of the stream."
        )
        self.stream_next_offset = self._scrape_stream(
            "tierlog_stream_next_offset", "Next offset of the stream's committed local log."
        )
        self.stream_queued_bytes = self._scrape_stream(
            "tierlog_stream_queued_bytes", "Publish bytes waiting for the stream's writer."
        )
        self.publishers_throttled = self._scrape_stream(
            "tierlog_publishers_throttled", "1 while the stream's publishers are throttled."
        )
        self.tier_lag_bytes = self._scrape_stream(
            "tierlog_tier_lag_bytes", "Committed bytes of the stream not yet tiered."
        )
        self.offload_early_deletions = self._scrape_stream(
            "tierlog_offload_early_deletions",
            "Offloaded local segments deleted before their deletion lag: free disk was under "
            "the floor (segment-mode streams).",
            "counter",
        )
        self.offloaded_segments = self._scrape_stream(
            "tierlog_offloaded_segments",
            "Segments this server offloaded and committed since the stream opened "
            "(segment-mode streams).",
            "counter",
        )
        self.tier_backpressure = self._scrape_stream(
            "tierlog_tier_backpressure",
            "1 while the stream is over its tiering lag or the disk floor (alarm).",
        )
        self.tiering_halted = self._scrape_stream(
            "tierlog_tiering_halted", "1 when tiering of the stream stopped (conflict, deposed)."
        )
        self.remote_next_offset = self._scrape_stream(
            "tierlog_remote_next_offset", "Next offset of the stream's committed manifest."
        )
        self.manifest_commits = self._scrape_stream(
            "tierlog_manifest_commits", "Manifest commits of the stream.", "counter"
        )
        self.manifest_conflicts = self._scrape_stream(
            "tierlog_manifest_conflicts",
            "Manifest commits of the stream that lost a race or were fenced.",
            "counter",
        )
        self.object_store_retries = self._scrape(
            "tierlog_object_store_retries",
            "Object-store failures that were retried, by operation and error kind "
            "(every store of this process).",
            "counter",
            ("op", "kind"),
        )
        self.object_store_lost_replies_resolved = self._scrape(
            "tierlog_object_store_lost_replies_resolved",
            "Create-only puts whose reply was lost and that read back as our own write.",
            "counter",
        )
        self.tier_lag_seconds = self._scrape_stream(
            "tierlog_tier_lag_seconds",
            "Seconds since the remote tier last held everything committed locally.",
        )
        self.tier_degraded = self._scrape_stream(
            "tierlog_tier_degraded",
            "1 while the stream's uploads or commits keep failing (cleared by successes).",
        )
        self.tier_task_failures = self._scrape(
            "tierlog_tier_task_failures",
            "Failed tiering tasks of the stream by task (upload, commit); each is retried.",
            "counter",
            (*STREAM_LABELS, "task"),
        )
        self.tier_stalled_tasks = self._scrape_stream(
            "tierlog_tier_stalled_tasks",
            "Uploads or commits of the stream in flight longer than store.task_stall_seconds.",
            "counter",
        )
        self.cold_chunk_bytes = self._scrape_stream(
            "tierlog_cold_chunk_bytes",
            "Chunk bytes the stream's tierer encoded into compressed or encrypted fragments.",
            "counter",
        )
        self.cold_stored_bytes = self._scrape_stream(
            "tierlog_cold_stored_bytes",
            "Frame bytes those chunks took in the fragments (after compression and sealing).",
            "counter",
        )
        self.cold_compression_ratio = self._scrape_stream(
            "tierlog_cold_compression_ratio",
            "Chunk bytes per stored byte of the stream's coded fragments (0 before the first).",
        )
        self.cold_dictionary_trainings = self._scrape_stream(
            "tierlog_cold_dictionary_trainings",
            "Compression dictionaries trained for the stream (first and retrained).",
            "counter",
        )
        self.prefetch_memory_bytes = self._scrape(
            "tierlog_prefetch_memory_bytes",
            "Bytes held by remote-read prefetch buffers (all readers, one budget).",
            "gauge",
        )
        self.consumer_buffer_bytes = self._scrape(
            "tierlog_consumer_buffer_bytes",
            "Bytes queued for consumers' sockets on all connections (each connection is "
            "capped at its write high-water mark plus one chunk).",
            "gauge",
        )
        # -- delayed delivery ---------------------------------------------------------
        self.delayed_scheduled = self._scrape_stream(
            "tierlog_delayed_scheduled",
            "Scheduled messages of a delayed stream not delivered yet (working set, parked "
            "and in flight).",
        )
        self.delayed_next_due_seconds = self._scrape_stream(
            "tierlog_delayed_next_due_seconds",
            "Due time of a delayed stream's earliest scheduled message (Unix seconds; absent "
            "when none).",
        )
        self.delayed_dispatch_halted = self._scrape_stream(
            "tierlog_delayed_dispatch_halted",
            "1 while a delayed stream does not dispatch because the node's clock differs from "
            "the MetaStore's by more than 500 ms.",
        )
        self.delayed_lateness_seconds = Histogram(
            "tierlog_delayed_lateness_seconds",
            "Time from a scheduled message's due time to its append to the stream.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delayed_dispatched = Counter(
            "tierlog_delayed_dispatched",
            "Scheduled messages appended to their stream when due.",
            registry=r,
        )
        self.delayed_accepted = Counter(
            "tierlog_delayed_accepted",
            "Scheduled messages accepted (appended to a system stream).",
            registry=r,
        )
        self.delayed_refused = Counter(
            "tierlog_delayed_refused",
            "Messages of delayed streams refused, by reason (bad_property, sub_batch).",
            ["reason"],
            registry=r,
        )
        self.delayed_cancelled = Counter(
            "tierlog_delayed_cancelled", "Scheduled messages cancelled.", registry=r
        )
        self.delayed_clock_skew_halts = Counter(
            "tierlog_delayed_clock_skew_halts",
            "Dispatch rounds skipped because the node's clock was skewed.",
            registry=r,
        )
        self.delayed_checkpoints = Counter(
            "tierlog_delayed_checkpoints",
            "Checkpoints written to delayed streams' system streams (pending messages carried "
            "forward so that older records may go).",
            registry=r,
        )
        self.delayed_timer_objects = Counter(
            "tierlog_delayed_timer_objects",
            "Timer objects written to the remote tier.",
            registry=r,
        )
        self.delayed_repairs = Counter(
            "tierlog_delayed_repairs",
            "Delayed-delivery state repaired from the system stream, by what was damaged "
            "(working_set, timer_object, timer_manifest).",
            ["kind"],
            registry=r,
        )
        self.delayed_foreign_records = Counter(
            "tierlog_delayed_foreign_records",
            "Records found in a system stream that are not delayed-delivery records (a "
            "restored or damaged file): skipped by the scheduler each time it reads them.",
            registry=r,
        )
        self.cluster = ClusterFamilies(self._scrape)
        r.register(ScrapedCollector(self._scraped))

    def _scrape(
        self,
        name: str,
        documentation: str,
        kind: Literal["gauge", "counter"],
        labels: tuple[str, ...] = (),
    ) -> Scraped:
        scraped = Scraped(name, documentation, kind, labels)
        self._scraped.append(scraped)
        return scraped

    def _scrape_stream(
        self, name: str, documentation: str, kind: Literal["gauge", "counter"] = "gauge"
    ) -> Scraped:
        return self._scrape(name, documentation, kind, STREAM_LABELS)

    # -- reading ----------------------------------------------------------------------
    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The /metrics body and its content type: Prometheus text, or OpenMetrics when
        the scraper's ``Accept`` header asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def value(self, sample: str, **labels: str) -> float:
        """One sample's current value (0 when absent), e.g.
        ``value("tierlog_overtaken_consumers_total", action="skip")``."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found
