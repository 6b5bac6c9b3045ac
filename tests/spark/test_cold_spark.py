"""Compressed fragments (format v2, zstd with a trained stream dictionary) read by the Spark
source and checked by scrub on real Spark: rows equal the stream's; a missing dictionary or
a damaged frame is a scrub problem."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.spark import TieredBucket, TieredStream
from tests.spark.test_jobs import tier_of, walk
from tests.spark.test_source import expected, read, rows_of
from tests.tiering.test_cold import event_bodies
from tierlog.formats.fragment import TRAILER_SIZE
from tierlog.formats.fragment_v2 import FragmentTrailerV2, decode_trailer
from tierlog.remote.settings import StreamSettings
from tierlog.spark.jobs.scrub import run_scrub
from tierlog.tiering.cold import FragmentCoder

pytestmark = pytest.mark.spark


def cold_stream(bucket: TieredBucket) -> TieredStream:
    stream = bucket.add_stream("events")
    settings = StreamSettings(compression="zstd", dictionary=True)
    stream.tierer.coder = FragmentCoder(stream.tierer.remote, lambda: settings)
    stream.append(event_bodies(random.Random(3), 1500), per_chunk=25)
    stream.tier()
    return stream


def test_spark_reads_and_scrubs_compressed_fragments(spark: Any, tmp_path: Path) -> None:
    bucket = TieredBucket(tmp_path, f"file://{tmp_path / 'objects'}")
    try:
        stream = cold_stream(bucket)
        fragments = walk(bucket, stream).fragments
        assert len(fragments) > 2
        assert all(
            isinstance(decode_trailer(bucket.store.get_suffix(f.key, TRAILER_SIZE)),
                       FragmentTrailerV2)
            for f in fragments
        )  # fmt: skip
        assert stream.tierer.coder is not None and stream.tierer.coder.dictionaries_trained
        got = rows_of(read(spark, bucket.options(stream)))
        assert got == expected(stream, stream.records())
        report = run_scrub(spark, tier_of(bucket))
        assert report.ok, report.to_dict()
        # Damage one frame and remove the dictionary: both are problems, typed by kind.
        data = bytearray(bucket.store.get(fragments[1].key))
        data[-20] ^= 0xFF  # inside the trailer: checked before any frame
        bucket.store.put(fragments[1].key, bytes(data))
        for meta in list(bucket.store.list()):
            if meta.key.endswith(".dict"):
                bucket.store.delete(meta.key)
        report = run_scrub(spark, tier_of(bucket))
        kinds = {(p["kind"], p["key"]) for s in report.streams for p in s.problems}
        assert ("corrupt-fragment", fragments[1].key) in kinds, kinds
        assert ("missing-dictionary", fragments[2].key) in kinds
    finally:
        bucket.close()


def test_key_index_job_is_incremental_and_lookups_find_the_records(
    spark: Any, tmp_path: Path
) -> None:
    import time

    from tierlog.formats.amqp import encode_message
    from tierlog.remote.key_index_files import list_index_files, message_id_key
    from tierlog.remote.key_index_manifest import KeyIndexManifestStore
    from tierlog.remote.key_lookup import lookup_key
    from tierlog.spark.jobs.key_index import run_key_index

    bucket = TieredBucket(tmp_path, f"file://{tmp_path / 'objects'}")
    try:
        stream = cold_stream(bucket)  # v2 fragments first
        for group in range(6):  # then AMQP messages over several 100 ms windows
            stream.append(
                [
                    encode_message(b"m%d" % i, properties={"message_id": f"id-{i % 13}"})
                    for i in range(group * 50, group * 50 + 50)
                ],
                per_chunk=10,
            )
            time.sleep(0.12)
        stream.tier()
        tier = tier_of(bucket)
        first = run_key_index(spark, tier, window_seconds=0.1)
        assert len(first.built) >= 4
        again = run_key_index(spark, tier, window_seconds=0.1)
        assert again.built == [] and again.skipped_existing == len(first.built)
        incarnation = stream.record.incarnation
        files = list_index_files(bucket.store, bucket.prefix, incarnation)
        manifest = (
            KeyIndexManifestStore(bucket.meta, bucket.store, bucket.prefix, incarnation)
            .read()
            .manifest
        )
        assert [w.start for w in manifest.windows] == [f.window_start for f in files]
        found = lookup_key(bucket.meta, bucket.store, bucket.prefix, "/", "events", b"id-7").records
        indexed_until = max(f.window_start for f in files) + 100
        expected = [
            (r.offset, r.body)
            for r in stream.records()
            if r.timestamp < indexed_until and message_id_key(memoryview(r.body)) == b"id-7"
        ]
        assert expected and [(o, b) for o, b in sorted(found)] == expected
    finally:
        bucket.close()
