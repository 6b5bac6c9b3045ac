"""The corruption matrix of an encrypted segment-mode stream: every sealed segment file kind
x {bit flip, truncation, zero-filled page, deleted}; hypothesis picks the file and position.

The stream's head is only in the object store (its local segments were freed after the
offload), its tail only local. After the damage the stream restarts as the server does
(offload service start: recovery of attempts, resolution) and everything is read from
``first`` through the cross-tier reader. Oracle: every confirmed record exactly once, in
order, or a typed refusal; never a wrong, skipped or repeated record. Outcomes are counted,
and an untouched copy must read back whole (so "refuse everything" cannot pass).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.faults.segment_kinds  # noqa: F401  (registers the sealed segment kinds)
from tests.faults.registry import DAMAGES, FILE_KINDS
from tests.faults.segment_kinds import SEGMENT_CAMPAIGN, SegmentCampaign
from tests.faults.stream import CampaignStream
from tests.faults.test_corruption_matrix import damage_file
from tests.support.keyring import process_keyring
from tierlog.errors import TierlogError
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.offload.service import SegmentOffloadService
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.remote.committed import CatalogCommittedManifest
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.deletion import DeletionQueue

KEYS = Keyring([("k1", bytes(range(32)))])
SETTINGS = StreamSettings(
    tier_mode="segments",
    encryption="aes-256-gcm",
    offload_threshold_bytes=0,
    offload_deletion_lag_seconds=0.0,
)
LOG = LogConfig(max_segment_bytes=40_000, fsync="never")
OUTCOMES: collections.Counter[str] = collections.Counter()


class Opened:
    """The stream restarted the way the server starts a segment-mode stream."""

    def __init__(self, root: str, stream_dir_name: str, *, create: bool = False) -> None:
        self.meta = SqliteMetaStore(os.path.join(root, "meta.db"))
        self.store = FsObjectStore(os.path.join(root, "objects"))
        self.catalog = Catalog(self.meta)
        self.log: StreamLog | None = None
        self.service: SegmentOffloadService | None = None
        if create:
            record = self.catalog.create("/", "s", SETTINGS)
            self.log = StreamLog.create(
                os.path.join(root, "data"), "/", "s", LOG, created_ns=record.created_ns
            )
        else:
            path = os.path.join(root, "data", stream_dir_name)
            self.log = StreamLog.open(path, LOG, adopt_disk_epoch=True)
        self.dir = os.path.basename(self.log.stream_dir)
        offloader = ObjectStoreOffloader(
            self.store, self.meta, "", self.dir, block_size=5 << 20, settings=lambda: SETTINGS
        )
        committer = ManifestCommitter(
            RemoteStream(self.store, "", self.dir),
            self.catalog,
            DeletionQueue(self.meta, grace_seconds=3600.0),
            max(1, self.log.max_epoch),
            m=2,
            settings=lambda: SETTINGS,
        )
        self.service = SegmentOffloadService(self.log, offloader, committer, lambda: SETTINGS)
        self.service.start()
        self.service.stop()  # the campaign drives ``run_once`` itself

    def read_all(self) -> list[tuple[int, bytes]]:
        manifest = ManifestSource(CatalogCommittedManifest(self.catalog, self.store, "", self.dir))
        with TieredReader(self.log, manifest, OffsetSpec.first()) as reader:
            return [(o, bytes(r)) for o, r in reader.records()]

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.log is not None:
            self.log.close()
        self.store.close()
        self.meta.close()


def build(root: str) -> SegmentCampaign:
    os.makedirs(root)
    set_process_keyring(KEYS)
    opened = Opened(root, "", create=True)
    assert opened.log is not None and opened.service is not None
    rng = random.Random(20)
    for i in range(150):
        opened.log.append([b"%d:" % i + rng.randbytes(rng.randint(50, 600)) for _ in range(4)])
        if i % 40 == 5:
            opened.log.store_offset("c", i)
    opened.log.sync()
    assert opened.service.run_once() >= 3
    assert opened.service.apply_local_deletion(), "the head must be remote-only"
    for i in range(10):  # the tail: local only
        opened.log.append([b"tail-%d" % i])
    opened.log.sync()
    stream = SegmentCampaign(root, opened.dir)
    stream.confirmed = opened.read_all()
    opened.close()
    assert stream.confirmed[0][0] == 0
    return stream


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> SegmentCampaign:
    return build(str(tmp_path_factory.mktemp("sealed-segments") / "pristine"))


@pytest.fixture(autouse=True)
def keyring() -> Iterator[Keyring]:
    with process_keyring() as ring:
        yield ring


def copy_of(stream: SegmentCampaign, root: str) -> SegmentCampaign:
    shutil.copytree(stream.root, root)
    return SegmentCampaign(root, stream.stream_dir_name, stream.confirmed)


def restart_and_read(stream: SegmentCampaign) -> tuple[list[tuple[int, bytes]], Exception | None]:
    opened: Opened | None = None
    try:
        opened = Opened(stream.root, stream.stream_dir_name)
        return opened.read_all(), None
    except TierlogError as exc:
        return [], exc
    finally:
        if opened is not None:
            opened.close()


def test_an_undamaged_copy_reads_back_whole(pristine: SegmentCampaign, tmp_path: Path) -> None:
    stream = copy_of(pristine, str(tmp_path / "copy"))
    records, error = restart_and_read(stream)
    assert error is None and records == pristine.confirmed


@settings(
    max_examples=int(os.environ.get("MATRIX_EXAMPLES_PER_CELL", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize(
    "kind_name", sorted(k for k, v in FILE_KINDS.items() if v.campaign == SEGMENT_CAMPAIGN)
)
def test_sealed_segment_damage_is_refused_never_misread(
    pristine: SegmentCampaign, tmp_path: Path, kind_name: str, how: str, data: st.DataObject
) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "copy"  # one per hypothesis example
    stream = copy_of(pristine, str(root))
    targets = FILE_KINDS[kind_name].locate(stream)  # type: ignore[arg-type]
    assert targets, f"no {kind_name} in the campaign stream"
    target = data.draw(st.sampled_from(targets), label="file")
    at = data.draw(st.integers(0, 1 << 30), label="position")
    bit = data.draw(st.integers(0, 7), label="bit")
    damage_file(target, how, at, bit, CampaignStream(str(root), stream.stream_dir_name))
    records, error = restart_and_read(stream)
    if error is not None:
        assert isinstance(error, TierlogError)
        verdict = "refused"
    else:
        assert records == stream.confirmed, f"{how} of {target.path}: records changed"
        verdict = "intact"
    OUTCOMES[f"{kind_name}/{how}/{verdict}"] += 1


def test_damage_outcomes_were_counted() -> None:
    """Runs after the matrix (file order): every kind was exercised."""
    if not OUTCOMES:
        pytest.skip("run together with the matrix")
    print(
        "sealed segment damage outcomes:\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(OUTCOMES.items()))
    )
    kinds = {k.split("/")[0] for k in OUTCOMES}
    assert kinds == {k for k, v in FILE_KINDS.items() if v.campaign == SEGMENT_CAMPAIGN}
