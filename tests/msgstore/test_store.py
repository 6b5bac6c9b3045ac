"""Store operations, recovery and compaction, with a crash injected at every step.

``MSGSTORE_FILE_KINDS`` and ``MSGSTORE_CRASH_POINTS`` describe the store for the durability
fault registry: the files it owns and every step at which a crash must leave a store that
recovers to the same contents.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats import msgstore as fmt
from tierlog.formats.errors import RecordChecksumError
from tierlog.msgstore import MessageStore, MsgNotFoundError, MsgStoreConfig
from tierlog.msgstore.compaction import COMPACTION_STEPS, plan_compaction
from tierlog.msgstore.errors import CorruptSegmentError, MixedStoreError, MsgStoreConfigError
from tierlog.msgstore.files import CLEAN_FILE, file_format, filenum_to_name
from tierlog.msgstore.migrate import MIGRATION_STEPS

MSGSTORE_FILE_KINDS = {
    "segment_v2": "<n>.sqs: 64-byte header + typed records (written, compacted, deleted)",
    "segment_v1": "<n>.rdq: RabbitMQ v1 records (read only; deleted when empty or migrated)",
    "migration_tmp": "<n>.sqs.tmp: migration target before its rename (deleted on open)",
    "clean_shutdown": f"{CLEAN_FILE}: last_v1_file + index, written on close, deleted on open",
}
MSGSTORE_CRASH_POINTS = (*COMPACTION_STEPS, *MIGRATION_STEPS, "recover.file_scanned")

SMALL = MsgStoreConfig(file_size_limit=8192, sync_writes=False)


class Crash(Exception):
    """Injected at a crash point."""


def _crash_at(point: str):  # type: ignore[no-untyped-def]
    def hook(name: str) -> None:
        if name == point:
            raise Crash(name)

    return hook


def _fill(store: MessageStore, rng: random.Random, count: int) -> dict[bytes, bytes]:
    contents = {}
    for _ in range(count):
        msg_id = rng.randbytes(16)
        body = rng.randbytes(rng.randint(0, 1500))
        store.write(msg_id, body)
        contents[msg_id] = body
    return contents


def _remove_some(
    store: MessageStore, contents: dict[bytes, bytes], rng: random.Random, fraction: float
) -> None:
    keys = list(contents)
    rng.shuffle(keys)
    for key in keys[: int(len(keys) * fraction)]:
        store.remove(key)
        del contents[key]


def _assert_contents(store: MessageStore, contents: dict[bytes, bytes]) -> None:
    assert set(store.index) == set(contents)
    for msg_id, body in contents.items():
        assert store.read(msg_id) == body


def test_file_format_dispatch() -> None:
    assert file_format(0, None) == "v2"
    assert file_format(3, 5) == "v1" and file_format(5, 5) == "v1"
    assert file_format(6, 5) == "v2"
    assert filenum_to_name(5, 5) == "5.rdq" and filenum_to_name(6, 5) == "6.sqs"
    assert filenum_to_name(0, None) == "0.sqs"


def test_config_is_checked() -> None:
    with pytest.raises(MsgStoreConfigError):
        MsgStoreConfig(file_size_limit=100)


def test_write_read_refcount_remove(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path) as store:
        store.write(b"a" * 16, b"body-a")
        store.write(b"a" * 16, b"body-a")  # a second reference
        store.write(b"b" * 16, b"")
        assert store.read(b"a" * 16) == b"body-a" and store.read(b"b" * 16) == b""
        store.remove(b"a" * 16)
        assert store.read(b"a" * 16) == b"body-a"
        store.remove(b"a" * 16)
        with pytest.raises(MsgNotFoundError):
            store.read(b"a" * 16)
        with pytest.raises(MsgNotFoundError):
            store.remove(b"a" * 16)
        # the removed record is now a hole in the file
        data = (tmp_path / "0.sqs").read_bytes()
        assert data[64:69] == fmt.hole_marker(fmt.message_size(6))
    with MessageStore.open(tmp_path) as store:
        assert store.recovered_clean
        _assert_contents(store, {b"b" * 16: b""})


def test_files_roll_and_empty_files_are_deleted(tmp_path: Path) -> None:
    rng = random.Random(1)
    with MessageStore.open(tmp_path, SMALL) as store:
        contents = _fill(store, rng, 60)
        assert len(store.files) > 3
        first = min(store.files)
        for msg_id in list(store.files[first].msg_ids):
            store.remove(msg_id)
            del contents[msg_id]
        assert first not in store.files and not (tmp_path / f"{first}.sqs").exists()
        _assert_contents(store, contents)


def test_dirty_recovery_equals_clean(tmp_path: Path) -> None:
    rng = random.Random(2)
    store = MessageStore.open(tmp_path, SMALL)
    contents = _fill(store, rng, 80)
    _remove_some(store, contents, rng, 0.5)
    store.write(next(iter(contents)), b"ignored")  # second reference
    store.sync()
    store.abandon()  # crash: no clean-shutdown file
    assert not (tmp_path / CLEAN_FILE).exists()
    store = MessageStore.open(tmp_path, SMALL)
    assert not store.recovered_clean
    _assert_contents(store, contents)
    store.close()
    store = MessageStore.open(tmp_path, SMALL)
    assert store.recovered_clean and not (tmp_path / CLEAN_FILE).exists()
    _assert_contents(store, contents)
    store.close()


def test_torn_tail_is_truncated_on_recovery(tmp_path: Path) -> None:
    store = MessageStore.open(tmp_path)
    store.write(b"a" * 16, b"x" * 100)
    store.write(b"b" * 16, b"y" * 100)
    store.abandon()
    path = tmp_path / "0.sqs"
    size = path.stat().st_size
    os.truncate(path, size - 7)
    with MessageStore.open(tmp_path) as store:
        _assert_contents(store, {b"a" * 16: b"x" * 100})
        store.write(b"c" * 16, b"z")
        _assert_contents(store, {b"a" * 16: b"x" * 100, b"c" * 16: b"z"})


def test_zero_filled_region_refuses_to_open(tmp_path: Path) -> None:
    store = MessageStore.open(tmp_path)
    store.write(b"a" * 16, b"x" * 100)
    store.abandon()
    with open(tmp_path / "0.sqs", "ab") as out:
        out.write(bytes(4096))
    with pytest.raises(CorruptSegmentError, match=r"0\.sqs"):
        MessageStore.open(tmp_path)


def test_bit_flip_is_a_typed_error_on_read(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path) as store:
        store.write(b"a" * 16, b"x" * 100)
    path = tmp_path / "0.sqs"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with MessageStore.open(tmp_path) as store, pytest.raises(RecordChecksumError):
        store.read(b"a" * 16)


def test_sqs_below_rdq_is_refused(tmp_path: Path) -> None:
    (tmp_path / "3.rdq").write_bytes(b"")
    (tmp_path / "2.sqs").write_bytes(fmt.encode_header())
    with pytest.raises(MixedStoreError):
        MessageStore.open(tmp_path)


def test_plan_compaction_matches_rabbitmq_rule() -> None:
    # live records at 64 (10), 200 (30), 300 (20): the last moves into the first hole
    live = [(64, 10, b"a"), (200, 30, b"b"), (300, 20, b"c")]
    moves, truncate = plan_compaction(live, 64)
    assert moves == [(300, 20, b"c", 74), (200, 30, b"b", 94)]
    assert truncate == 124
    assert plan_compaction([], 64) == ([], 64)


@given(st.integers(0, 2**32), st.floats(0.0, 1.0))
def test_compaction_keeps_contents(
    tmp_path_factory: pytest.TempPathFactory, seed: int, fraction: float
) -> None:
    rng = random.Random(seed)
    directory = tmp_path_factory.mktemp("compact")
    store = MessageStore.open(directory, SMALL)
    contents = _fill(store, rng, 40)
    _remove_some(store, contents, rng, fraction)
    sizes = {}
    for file in list(store.files):
        if file in store.files and file != store.current_file:
            before = store.files[file].size
            result = store.compact(file)
            sizes[file] = (before, result.size_after)
            assert result.size_after <= before
            assert os.path.getsize(directory / f"{file}.sqs") == result.size_after
            _assert_contents(store, contents)
    store.abandon()
    store = MessageStore.open(directory, SMALL)  # dirty: a scan must find the same
    _assert_contents(store, contents)
    store.close()


def test_compaction_writes_no_zero_fill(tmp_path: Path) -> None:
    rng = random.Random(5)
    store = MessageStore.open(tmp_path, MsgStoreConfig(file_size_limit=1 << 20, sync_writes=False))
    contents = _fill(store, rng, 300)
    store.write(b"z" * 16, b"current file stays")
    contents[b"z" * 16] = b"current file stays"
    _remove_some(store, contents, rng, 0.7)
    file = 0
    store.current_file = None  # make file 0 compactable
    result = store.compact(file)
    assert result.moved > 0
    # bytes written: the moved records plus 5-byte markers, far below the gaps' size
    gaps = (
        result.size_before
        - fmt.HEADER_SIZE
        - sum(store.index[m].size for m in store.files[file].msg_ids)
    )
    assert result.bytes_written <= result.bytes_moved + 10 * (result.moved + 1) + 5 * 300
    assert result.bytes_written < gaps
    _assert_contents(store, contents)
    store.close()


@pytest.mark.parametrize("point", COMPACTION_STEPS)
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_compaction_crash_at_every_step(tmp_path: Path, point: str, seed: int) -> None:
    rng = random.Random(seed)
    store = MessageStore.open(tmp_path, SMALL)
    contents = _fill(store, rng, 50)
    _remove_some(store, contents, rng, 0.7)
    store.sync()
    candidates = store.compaction_candidates()
    assert candidates
    store.crash_hook = _crash_at(point)
    with pytest.raises(Crash):
        for file in candidates:
            store.compact(file)
    store.abandon()
    store = MessageStore.open(tmp_path, SMALL)
    assert not store.recovered_clean
    _assert_contents(store, contents)
    # and the recovered store compacts and recovers again to the same contents
    for file in store.compaction_candidates():
        store.compact(file)
    store.abandon()
    store = MessageStore.open(tmp_path, SMALL)
    _assert_contents(store, contents)
    store.close()


@pytest.mark.parametrize("point", COMPACTION_STEPS)
def test_compaction_torn_write_at_every_step(tmp_path: Path, point: str) -> None:
    """A crash that also loses everything not fsynced: the file as of the last fsync plus
    a prefix of the bytes written since is what the next open finds."""
    rng = random.Random(99)
    store = MessageStore.open(tmp_path, SMALL)
    contents = _fill(store, rng, 50)
    _remove_some(store, contents, rng, 0.7)
    store.sync()
    file = store.compaction_candidates()[0]
    path = tmp_path / f"{file}.sqs"
    synced = path.read_bytes()
    fsync_points = {"compact.fsync_fill", "compact.fsync_headers"}

    def hook(name: str) -> None:
        nonlocal synced
        if name in fsync_points:
            synced = path.read_bytes()
        if name == point:
            raise Crash(name)

    store.crash_hook = hook
    with pytest.raises(Crash):
        store.compact(file)
    store.abandon()
    path.write_bytes(synced)  # the unsynced writes are lost
    store = MessageStore.open(tmp_path, SMALL)
    _assert_contents(store, contents)
    store.close()


def test_crash_during_recovery(tmp_path: Path) -> None:
    """Recovery writes too (second copies become holes, torn tails are cut): a crash
    after any file's recovery leaves a store that recovers to the same contents."""
    rng = random.Random(7)
    store = MessageStore.open(tmp_path, SMALL)
    contents = _fill(store, rng, 60)
    _remove_some(store, contents, rng, 0.7)
    store.crash_hook = _crash_at("compact.fsync_headers")  # leaves second copies
    with pytest.raises(Crash):
        for file in store.compaction_candidates():
            store.compact(file)
    store.abandon()
    last = tmp_path / f"{max(int(p.stem) for p in tmp_path.glob('*.sqs'))}.sqs"
    with open(last, "ab") as out:
        out.write(fmt.encode_message(b"t" * 16, b"torn")[:-2])
    for crash_count in range(3):
        seen = {"n": 0}

        def hook(name: str, limit: int = crash_count, seen: dict[str, int] = seen) -> None:
            if name == "recover.file_scanned":
                if seen["n"] == limit:
                    raise Crash(name)
                seen["n"] += 1

        with pytest.raises(Crash):
            MessageStore.open(tmp_path, SMALL, crash_hook=hook)
    store = MessageStore.open(tmp_path, SMALL)
    _assert_contents(store, contents)
    store.close()


class _LosingDisk:
    """Stands in for ``os`` in the compaction module: every write since the last fsync of
    the file is pending, and a crash keeps an arbitrary subset of them (in order), as a
    disk cache that reorders and drops unsynced writes would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.synced = path.read_bytes()
        self.pending: list[tuple[str, int, bytes]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self.pending.append(("write", offset, bytes(data)))
        return os.pwrite(fd, data, offset)

    def ftruncate(self, fd: int, length: int) -> None:
        self.pending.append(("truncate", length, b""))
        os.ftruncate(fd, length)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self.synced = self.path.read_bytes()
        self.pending.clear()

    fdatasync = fsync

    def crash(self, rng: random.Random) -> None:
        data = bytearray(self.synced)
        for op, at, payload in self.pending:
            if rng.random() < 0.5:
                continue
            if op == "truncate":
                del data[at:]
            else:
                if len(data) < at + len(payload):
                    data.extend(bytes(at + len(payload) - len(data)))
                data[at : at + len(payload)] = payload
        self.path.write_bytes(bytes(data))


@pytest.mark.parametrize("point", COMPACTION_STEPS)
@pytest.mark.parametrize("subset_seed", range(4))
def test_compaction_crash_losing_any_unsynced_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, subset_seed: int
) -> None:
    from tierlog.msgstore import compaction

    rng = random.Random(1000 + subset_seed)
    store = MessageStore.open(tmp_path, SMALL)
    contents = _fill(store, rng, 50)
    _remove_some(store, contents, rng, 0.7)
    store.sync()
    file = store.compaction_candidates()[0]
    disk = _LosingDisk(tmp_path / f"{file}.sqs")
    monkeypatch.setattr(compaction, "os", disk)
    store.crash_hook = _crash_at(point)
    with pytest.raises(Crash):
        store.compact(file)
    store.abandon()
    disk.crash(rng)
    monkeypatch.undo()
    store = MessageStore.open(tmp_path, SMALL)
    _assert_contents(store, contents)
    store.close()


def test_removals_merge_into_one_hole(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path) as store:
        ids = [bytes([i]) * 16 for i in range(4)]
        for i, msg_id in enumerate(ids):
            store.write(msg_id, b"x" * (10 + i))
        sizes = [fmt.message_size(10 + i) for i in range(4)]
        for i in (0, 2, 1):  # A, then C, then B between two holes
            store.remove(ids[i])
        data = (tmp_path / "0.sqs").read_bytes()
        assert data[64:69] == fmt.hole_marker(sum(sizes[:3]))
        records: list[fmt.Record] = []
        fmt.scan_block(data, 0, 64, len(data), records)
        assert [(r.type, r.size) for r in records] == [
            (fmt.HOLE, sum(sizes[:3])),
            (fmt.MESSAGE_WITH_CHECKSUM, sizes[3]),
        ]


def test_plain_message_records_are_read(tmp_path: Path) -> None:
    """MESSAGE (no checksum) is a valid record: a store finds and reads it."""
    data = (
        fmt.encode_header()
        + fmt.encode_message(b"p" * 16, b"plain", checksum=False)
        + fmt.encode_hole(40)
        + fmt.encode_message(b"c" * 16, b"checked")
    )
    (tmp_path / "0.sqs").write_bytes(data)
    with MessageStore.open(tmp_path) as store:
        _assert_contents(store, {b"p" * 16: b"plain", b"c" * 16: b"checked"})


def test_bad_header_refuses_to_open(tmp_path: Path) -> None:
    (tmp_path / "0.sqs").write_bytes(b"RCQS\x02" + bytes(59) + fmt.encode_message(b"a" * 16, b""))
    with pytest.raises(CorruptSegmentError, match="magic"):
        MessageStore.open(tmp_path)
