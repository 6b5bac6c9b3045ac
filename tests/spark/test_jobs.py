"""The Spark maintenance jobs (scrub, gc, export) on a small multi-stream remote tier,
on the filesystem store and on SeaweedFS, with real Spark (the session fixture)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.spark import TieredBucket, TieredStream
from tierlog.remote import keys
from tierlog.spark.jobs.common import RemoteTier, walk_manifest
from tierlog.spark.jobs.gc import run_gc
from tierlog.spark.jobs.scrub import run_scrub

pytestmark = pytest.mark.spark


def fill(bucket: TieredBucket) -> tuple[TieredStream, TieredStream]:
    alpha = bucket.add_stream("alpha")
    beta = bucket.add_stream("beta")
    alpha.append([b"a%05d" % i + os.urandom(90) for i in range(1200)])
    beta.append([b"b%05d" % i + os.urandom(90) for i in range(400)])
    alpha.tier()
    beta.tier()
    return alpha, beta


def tier_of(bucket: TieredBucket) -> RemoteTier:
    return RemoteTier.create(bucket.store_uri, bucket.meta_uri, bucket.prefix)


def walk(bucket: TieredBucket, stream: TieredStream) -> Any:
    return walk_manifest(bucket.store, bucket.catalog, bucket.prefix, stream.record.incarnation)


def all_keys(bucket: TieredBucket) -> set[str]:
    return {m.key for m in bucket.store.list("")}


def flip_byte(bucket: TieredBucket, key: str, position: int) -> None:
    data = bytearray(bucket.store.get(key))
    data[position] ^= 0xFF
    bucket.store.put(key, bytes(data))


# ----------------------------------------------------------------------------- scrub


def test_scrub_passes_a_healthy_bucket(spark: Any, tiered_bucket: TieredBucket) -> None:
    alpha, beta = fill(tiered_bucket)
    report = run_scrub(spark, tier_of(tiered_bucket), target_bytes=20_000)
    assert report.ok, report.to_dict()
    by_name = {s.name: s for s in report.streams}
    assert by_name["alpha"].fragments == len(walk(tiered_bucket, alpha).fragments) > 8
    assert by_name["alpha"].branches > 0  # the tree has branch objects (m=4)
    assert by_name["beta"].fragments == len(walk(tiered_bucket, beta).fragments)
    assert by_name["alpha"].next_offset == alpha.tierer.durable_next


def test_scrub_finds_planted_damage_per_stream(spark: Any, tiered_bucket: TieredBucket) -> None:
    alpha, beta = fill(tiered_bucket)
    beta_fragment = walk(tiered_bucket, beta).fragments[1]
    flip_byte(tiered_bucket, beta_fragment.key, 8 + 48 + 30)  # inside the first chunk's data
    alpha_walk = walk(tiered_bucket, alpha)
    missing = alpha_walk.fragments[-1].key  # a root-level fragment
    tiered_bucket.store.delete(missing)
    lost_branch = alpha_walk.branch_keys[0]
    tiered_bucket.store.delete(lost_branch)
    report = run_scrub(spark, tier_of(tiered_bucket))
    assert not report.ok
    problems = {s.name: {(p["kind"], p["key"]) for p in s.problems} for s in report.streams}
    assert problems["beta"] == {("corrupt-fragment", beta_fragment.key)}
    assert ("missing-fragment", missing) in problems["alpha"]
    assert ("missing-branch", lost_branch) in problems["alpha"]
    beta_problem = next(s for s in report.streams if s.name == "beta").problems[0]
    assert "CRC" in beta_problem["detail"]
    assert json.loads(json.dumps(report.to_dict()))["problems"] == len(problems["alpha"]) + 1


def test_scrub_reports_a_fragment_that_disagrees_with_its_entry(
    spark: Any, tiered_bucket: TieredBucket
) -> None:
    _alpha, beta = fill(tiered_bucket)
    fragments = walk(tiered_bucket, beta).fragments
    # A valid fragment under the wrong key: its trailer range differs from the entry (a gap).
    tiered_bucket.store.put(fragments[0].key, tiered_bucket.store.get(fragments[1].key))
    report = run_scrub(spark, tier_of(tiered_bucket), ["beta"])
    (stream,) = report.streams
    assert [p["kind"] for p in stream.problems] == ["fragment-mismatch"]
    assert "first_offset" in stream.problems[0]["detail"]


# -------------------------------------------------------------------------------- gc


def test_gc_removes_planted_orphans_and_nothing_else(
    spark: Any, tiered_bucket: TieredBucket
) -> None:
    alpha, beta = fill(tiered_bucket)
    store, prefix = tiered_bucket.store, tiered_bucket.prefix
    inc = alpha.record.incarnation
    alpha_walk = walk(tiered_bucket, alpha)
    some_fragment = store.get(alpha_walk.fragments[0].key)
    orphan_fragment = keys.fragment_key(prefix, inc, alpha_walk.fragments[0].first_offset + 1)
    orphan_root = keys.root_key(prefix, inc, keys.new_uid())
    orphan_branch = keys.branch_key(prefix, inc, 0, keys.new_uid(), 1)
    tail_fragment = keys.fragment_key(prefix, inc, alpha_walk.next_offset + 5)  # adoptable
    pending_branch = keys.branch_key(prefix, inc, 0, keys.new_uid(), 1)
    unknown = keys.stream_prefix(prefix, inc) + "data/notes.txt"
    dead = keys.fragment_key(prefix, "%2F_gone_1", 0)  # an incarnation not in the catalog
    for key in (orphan_fragment, orphan_root, orphan_branch, tail_fragment, pending_branch, dead):
        store.put(key, some_fragment)
    store.put(unknown, b"not a tierlog object")
    tiered_bucket.deletions.schedule([pending_branch], grace_seconds=3600)
    planted_garbage = {orphan_fragment, orphan_root, orphan_branch, dead}
    tier = tier_of(tiered_bucket)

    young = run_gc(spark, tier, grace_seconds=3600)  # everything is younger than that
    assert young.garbage == []

    before = all_keys(tiered_bucket)
    later = time.time() + 120
    dry = run_gc(spark, tier, grace_seconds=60, now=later)
    garbage = set(dry.garbage)
    assert planted_garbage <= garbage
    assert not garbage & (alpha_walk.referenced() | walk(tiered_bucket, beta).referenced())
    assert not garbage & {tail_fragment, pending_branch, unknown}
    assert all_keys(tiered_bucket) == before  # a dry run deletes nothing
    by_inc = {i.incarnation: i for i in dry.incarnations}
    assert unknown in by_inc[inc].unknown
    assert by_inc[inc].protected_tail == 1 and by_inc[inc].pending >= 1
    assert not by_inc["%2F_gone_1"].live

    applied = run_gc(spark, tier, grace_seconds=60, apply=True, now=later)
    assert set(applied.garbage) == garbage
    assert all_keys(tiered_bucket) == before - garbage
    assert run_scrub(spark, tier).ok  # every live manifest and fragment survived
    assert run_gc(spark, tier, grace_seconds=60, now=later).garbage == []


def test_gc_leaves_a_stream_with_an_unreadable_manifest_alone(
    spark: Any, tiered_bucket: TieredBucket
) -> None:
    alpha, _beta = fill(tiered_bucket)
    alpha_walk = walk(tiered_bucket, alpha)
    tiered_bucket.store.delete(alpha_walk.branch_keys[0])
    orphan = keys.root_key(tiered_bucket.prefix, alpha.record.incarnation, keys.new_uid())
    tiered_bucket.store.put(orphan, b"x")
    report = run_gc(
        spark, tier_of(tiered_bucket), grace_seconds=0, apply=True, now=time.time() + 60
    )
    alpha_gc = next(i for i in report.incarnations if i.incarnation == alpha.record.incarnation)
    assert alpha_gc.skipped_reason and alpha_gc.deleted == 0
    assert not report.ok
    assert orphan in all_keys(tiered_bucket)


# ---------------------------------------------------------------------------- export


def exported(spark: Any, output: Path) -> list[tuple[str, int, bytes, str]]:
    rows = spark.read.parquet(str(output)).select("stream", "offset", "body", "date").collect()
    return sorted((r["stream"], int(r["offset"]), bytes(r["body"]), str(r["date"])) for r in rows)


def expected_rows(stream: TieredStream) -> list[tuple[str, int, bytes, str]]:
    import datetime as dt

    def day(ms: int) -> str:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()

    durable = stream.tierer.durable_next
    return [(stream.name, r.offset, r.body, day(r.timestamp)) for r in stream.records(0, durable)]


def test_export_is_incremental_across_runs(
    spark: Any, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    from tierlog.spark.jobs.export import STATE_DIR, run_export

    alpha, beta = fill(tiered_bucket)
    tier = tier_of(tiered_bucket)
    output = tmp_path / "export"
    first = run_export(spark, tier, str(output))
    assert {s.name: (s.start_offset, s.end_offset) for s in first.streams} == {
        "alpha": (0, alpha.tierer.durable_next),
        "beta": (0, beta.tierer.durable_next),
    }
    assert exported(spark, output) == sorted(expected_rows(alpha) + expected_rows(beta))
    assert any(p.name.startswith("date=") for p in output.iterdir())

    alpha_end = alpha.tierer.durable_next
    alpha.append([b"more%05d" % i for i in range(300)])
    alpha.tier()
    second = run_export(spark, tier, str(output))
    assert [(s.name, s.start_offset) for s in second.streams] == [("alpha", alpha_end)]
    rows = exported(spark, output)
    assert len(rows) == len(set(rows))  # nothing exported twice
    assert rows == sorted(expected_rows(alpha) + expected_rows(beta))

    assert run_export(spark, tier, str(output)).streams == []  # nothing new
    assert len(spark.read.parquet(str(output / STATE_DIR)).collect()) == 3
