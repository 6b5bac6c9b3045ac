"""The key-index manifest: its format (golden bytes, damage refused), commits fenced like the
stream manifest (compare-and-swap retried under races, a higher epoch fences, nothing left
behind by a lost commit), retention through the grace-period deletion queue, and lookups
through it on plain and encrypted streams with the GETs per key per window counted."""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.remote.test_key_index_files import CountingStore
from tests.tiering.test_cold import ColdStream
from tierlog.errors import ConfigError
from tierlog.formats.amqp import encode_message
from tierlog.formats.chunk import SubBatch
from tierlog.formats.errors import FormatError
from tierlog.formats.key_index_manifest import (
    KeyIndexManifest,
    WindowEntry,
    decode_manifest,
    encode_manifest,
)
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.remote.catalog import pointer_key as stream_pointer_key
from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring
from tierlog.remote.errors import KeyIndexFencedError, KeyIndexManifestError
from tierlog.remote.key_index_files import build_window, message_id_key
from tierlog.remote.key_index_manifest import (
    KeyIndexManifestStore,
    add_windows,
    drop_expired,
    manifest_key,
    pointer_key,
)
from tierlog.remote.key_lookup import lookup_key
from tierlog.remote.sealing import is_sealed
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue

W1 = WindowEntry(0, 1000, 3, 9, 120)
W2 = WindowEntry(1000, 2000, 1, 0, 130, b"\x01\x02k1" + bytes(60), 4096, "property:k")


def test_golden_bytes() -> None:
    data = encode_manifest(KeyIndexManifest("__s_1", 7, (W2, W1)))
    body = (
        b'{"stream_dir":"__s_1","windows":['
        b'{"end":1000,"frame_size":0,"items":9,"key":"message-id","key_block":"",'
        b'"next_offset":120,"slots":3,"start":0},'
        b'{"end":2000,"frame_size":4096,"items":0,"key":"property:k",'
        b'"key_block":"01026b31' + b"00" * 60 + b'",'
        b'"next_offset":130,"slots":1,"start":1000}]}'
    )
    header = b"TLKM" + (1).to_bytes(4, "big") + (7).to_bytes(8, "big")
    header += len(body).to_bytes(4, "big")
    header += zlib.crc32(header + body).to_bytes(4, "big")
    assert data == header + body
    assert decode_manifest(data) == KeyIndexManifest("__s_1", 7, (W1, W2))


@settings(max_examples=80, deadline=None)
@given(where=st.integers(min_value=0), bit=st.integers(min_value=0, max_value=7))
def test_any_flipped_bit_is_refused(where: int, bit: int) -> None:
    data = bytearray(encode_manifest(KeyIndexManifest("__s_1", 7, (W1, W2))))
    data[where % len(data)] ^= 1 << bit
    with pytest.raises(FormatError):
        decode_manifest(bytes(data))


def test_truncated_or_inconsistent_manifests_are_refused() -> None:
    data = encode_manifest(KeyIndexManifest("__s_1", 7, (W1,)))
    for cut in (0, 10, len(data) - 1):
        with pytest.raises(FormatError):
            decode_manifest(data[:cut])
    body = json.dumps({"stream_dir": "s", "windows": [W1.to_json(), W1.to_json()]}).encode()
    head = b"TLKM" + (1).to_bytes(4, "big") + bytes(8) + len(body).to_bytes(4, "big")
    repeated = head + zlib.crc32(head + body).to_bytes(4, "big") + body
    with pytest.raises(FormatError, match="repeated"):
        decode_manifest(repeated)


class Stores:
    def __init__(self, root: Path) -> None:
        self.meta = SqliteMetaStore(str(root / "meta.db"))
        self.store = FsObjectStore(str(root / "objects"))
        self.scheduled: list[str] = []
        self.meta.create(stream_pointer_key("__s_1"), b'{"root": null, "epoch": 1}', 1)

    def index(self, epoch: int = 1, **settings: object) -> KeyIndexManifestStore:
        s = StreamSettings(**settings)  # type: ignore[arg-type]
        return KeyIndexManifestStore(
            self.meta, self.store, "p", "__s_1", epoch=epoch, settings=lambda: s
        )

    def schedule(self, keys: Iterable[str]) -> None:
        self.scheduled += list(keys)

    def manifests(self) -> list[str]:
        return sorted(m.key for m in self.store.list() if m.key.endswith(".kim"))


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(tmp_path)
    yield s
    s.meta.close()


def test_commits_race_and_retry(stores: Stores) -> None:
    a, b = stores.index(), stores.index()
    assert a.read().uid is None and a.read().manifest.windows == ()
    first = a.commit(add_windows([W1]), stores.schedule)
    assert first.manifest.windows == (W1,) and stores.scheduled == []
    calls = 0

    def racing(windows: tuple[WindowEntry, ...]) -> list[WindowEntry]:
        nonlocal calls
        calls += 1
        if calls == 1:  # another writer commits between our read and our pointer put
            b.commit(add_windows([W2]), stores.schedule)
        return [w for w in windows if w.start != W1.start]

    after = a.commit(racing, stores.schedule)
    assert calls == 2 and a.conflicts == 1
    assert after.manifest.windows == (W2,)  # re-applied to the winner's windows
    assert a.read().manifest.windows == (W2,)
    # the lost attempt's object is gone; superseded ones are only scheduled
    live = {manifest_key("p", "__s_1", after.uid or "")}
    assert set(stores.manifests()) - live <= set(stores.scheduled)
    assert any(k.endswith(".kidx") for k in stores.scheduled)  # W1's file, dropped
    unchanged = a.commit(add_windows([W2]), stores.schedule)
    assert unchanged.uid == after.uid  # nothing to change: no commit


def test_a_higher_epoch_fences_a_lower_one(stores: Stores) -> None:
    stores.index(epoch=3).commit(add_windows([W1]), stores.schedule)
    before = stores.manifests()
    with pytest.raises(KeyIndexFencedError):
        stores.index(epoch=2).commit(add_windows([W2]), stores.schedule)
    assert stores.manifests() == before  # nothing left behind
    stores.index(epoch=3).commit(add_windows([W2]), stores.schedule)
    assert stores.index().read().manifest.windows == (W1, W2)


def test_damaged_pointer_or_manifest_is_a_typed_error(stores: Stores) -> None:
    index = stores.index()
    committed = index.commit(add_windows([W1]), stores.schedule)
    key = manifest_key("p", "__s_1", committed.uid or "")
    good = stores.store.get(key)
    stores.store.put(key, good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(KeyIndexManifestError):
        index.read()
    stores.store.put(key, good)
    stored = stores.meta.get(pointer_key("__s_1"))
    assert stored is not None
    stores.meta.put_if(pointer_key("__s_1"), b"{oops", stored.version, 1)
    with pytest.raises(KeyIndexManifestError, match="pointer"):
        index.read()


def test_encrypted_stream_seals_its_index_manifest(stores: Stores) -> None:
    set_process_keyring(Keyring([("k1", bytes(32))]))
    try:
        index = stores.index(encryption="aes-256-gcm")
        committed = index.commit(add_windows([W1]), stores.schedule)
        stored = stores.store.get(manifest_key("p", "__s_1", committed.uid or ""))
        assert is_sealed(stored) and b"next_offset" not in stored
        assert index.read().manifest.windows == (W1,)
        set_process_keyring(Keyring([("k2", os.urandom(32))]))
        with pytest.raises(KeyIndexManifestError, match="'k1'"):
            index.read()
    finally:
        reset_process_keyring()


def test_retention_drops_windows_through_the_grace_queue(tmp_path: Path) -> None:
    stores = Stores(tmp_path)
    try:
        index = stores.index()
        w3 = WindowEntry(2000, 3000, 1, 4, 200)
        for w in (W1, W2, w3):
            name = f"p/stream/__s_1/kindex/{w.start:020d}.{w.slots}.{w.items}.kidx"
            stores.store.put(name, b"x")
        queue = DeletionQueue(stores.meta, grace_seconds=0.0)
        index.commit(add_windows([W1, W2, w3]), queue.schedule)
        after = index.commit(drop_expired(125), queue.schedule)  # W1 (next 120) is past
        assert [w.start for w in after.manifest.windows] == [1000, 2000]
        pending = {k for k, _ in queue.pending_keys()}
        assert "p/stream/__s_1/kindex/00000000000000000000.3.9.kidx" in pending
        assert stores.store.head("p/stream/__s_1/kindex/00000000000000000000.3.9.kidx")
        queue.run_due(stores.store)
        kept = sorted(m.key for m in stores.store.list() if m.key.endswith(".kidx"))
        assert kept == [
            "p/stream/__s_1/kindex/00000000000000001000.1.0.kidx",
            "p/stream/__s_1/kindex/00000000000000002000.1.4.kidx",
        ]
        assert len(stores.manifests()) == 1  # superseded manifests went too
    finally:
        stores.meta.close()


# ----- lookups through the manifest on real fragments ------------------------------------


def publish_keyed(s: ColdStream, batches: int = 40, per_batch: int = 25) -> None:
    """Unique message ids, but every 50th message is ``hot`` (many records, many windows)."""
    n = 0
    for _batch in range(batches):
        entries: list[bytes | SubBatch] = []
        for _ in range(per_batch):
            body = b'{"n":%d}' % n
            key = "hot" if n % 50 == 0 else f"order-{n}"
            entries.append(encode_message(body, properties={"message_id": key}))
            n += 1
        s.log.append(entries)
    s.log.sync()


@pytest.mark.parametrize(
    "settings",
    [{}, {"compression": "zstd", "dictionary": True, "encryption": "aes-256-gcm"}],
    ids=["v1", "v2-encrypted"],
)
def test_lookup_key_through_the_manifest(tmp_path: Path, settings: dict[str, object]) -> None:
    set_process_keyring(Keyring([("k1", bytes(range(32)))]))
    s = ColdStream(tmp_path, StreamSettings(**settings))  # type: ignore[arg-type]
    s.catalog.update_settings("/", "s", **settings)
    try:
        publish_keyed(s)
        with LogReader(s.log, OffsetSpec.first()) as reader:
            local = [(o, bytes(r)) for o, r in reader.records()]
        s.tier_and_free()
        remote = s.tierer.remote
        fragments = [loc.entry for loc in s.tierer.committer.tree.iter_fragments(remote.load)]
        stamps = sorted({f.min_timestamp for f in fragments})
        bounds = [0, stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3], 1 << 62]
        stream_settings = s.catalog.require("/", "s").settings
        windows = []
        for start, end in itertools.pairwise(bounds):
            built = build_window(
                s.store,
                remote.prefix,
                remote.stream_dir,
                "s",
                fragments,
                start,
                end,
                settings=stream_settings,
            )
            assert is_sealed(s.store.get(built.key)) == bool(settings)
            next_offset = max(f.next_offset for f in fragments)
            windows.append(
                WindowEntry(
                    start,
                    end,
                    built.slot_count,
                    built.item_count,
                    next_offset,
                    built.key_block,
                    built.frame_size,
                )
            )
        index = KeyIndexManifestStore(
            s.meta, s.store, remote.prefix, remote.stream_dir, settings=lambda: stream_settings
        )
        index.commit(add_windows(windows), lambda keys: None)
        counting = CountingStore(str(tmp_path / "objects"))
        for key in (b"order-5", b"order-777", b"no-such-key", b"hot"):
            CountingStore.gets = []
            found = lookup_key(s.meta, counting, remote.prefix, "/", "s", key)
            expected = [(o, r) for o, r in local if message_id_key(memoryview(r)) == key]
            assert found.records == expected and found.windows == 3
            kinds = [g[0].rpartition(".")[2] for g in CountingStore.gets]
            assert kinds.count("kim") == 1  # the manifest: once per lookup, not per window
            index_gets = kinds.count("kidx")
            assert index_gets <= 2 * found.windows  # slot entry, then the slot's items
            fragment_gets = kinds.count("fragment")
            extra = kinds.count("dict")
            if settings:
                # a v2 fragment's index (trailer, index) once per fragment touched
                touched = {g[0] for g in CountingStore.gets if g[0].endswith(".fragment")}
                extra += 2 * len(touched)
            records_read = fragment_gets - (extra - kinds.count("dict"))
            assert records_read <= len(found.records)  # one GET per record at most
            if key.startswith(b"order"):
                per_window = (index_gets + records_read) / found.windows
                assert per_window <= 3
                assert index_gets + records_read <= 2 * found.windows + len(found.records)
            if not settings:
                assert extra == 0  # v1: the frame is the chunk, nothing else to read
        # a time range narrows the windows searched and the records returned
        lo = stamps[len(stamps) // 3]
        everything = lookup_key(s.meta, s.store, remote.prefix, "/", "s", b"hot").records
        ranged = lookup_key(s.meta, s.store, remote.prefix, "/", "s", b"hot", from_timestamp=lo)
        assert ranged.windows == 2
        assert ranged.records and set(ranged.records) < set(everything)
    finally:
        s.close()
        reset_process_keyring()


def test_a_crash_between_window_files_and_the_commit_is_repaired_by_a_rerun(
    tmp_path: Path,
) -> None:
    """The index job died after writing (sealed) window files and before committing them:
    the rerun finds the files, reuses them with their own key blocks, and commits; an
    orphaned manifest object from a lost commit is ignored."""
    from tierlog.remote.catalog import Catalog
    from tierlog.remote.key_index_build import (
        build_task,
        committed_fragments,
        index_stream,
        plan_stream,
    )

    set_process_keyring(Keyring([("k1", bytes(range(32)))]))
    settings = {"compression": "zstd", "encryption": "aes-256-gcm"}
    s = ColdStream(tmp_path, StreamSettings(**settings))  # type: ignore[arg-type]
    s.catalog.update_settings("/", "s", **settings)
    try:
        publish_keyed(s, batches=30)
        s.tier_and_free()
        prefix, inc = s.tierer.remote.prefix, s.tierer.remote.stream_dir
        catalog = Catalog(s.meta)
        record = catalog.require("/", "s")
        epoch, first, fragments = committed_fragments(catalog, s.store, prefix, inc)
        stamps = sorted(f.min_timestamp for f in fragments)
        window_ms = max(1, (stamps[-1] - stamps[0]) // 4)
        plan = plan_stream(
            s.meta,
            s.store,
            prefix,
            record,
            window_ms,
            epoch=epoch,
            first_offset=first,
            fragments=fragments,
        )
        assert plan.tasks
        crashed = [build_task(s.store, prefix, t) for t in plan.tasks]  # then the "crash"
        orphan = manifest_key(prefix, inc, "0" * 32)
        s.store.put(orphan, b"a manifest whose pointer put never happened")
        committed, built, _ = index_stream(
            s.meta, s.store, prefix, "/", "s", window_ms, lambda keys: None
        )
        assert built == len(crashed)
        assert list(committed.manifest.windows) == crashed  # the same files, same key blocks
        assert all(w.sealed for w in crashed)
        found = lookup_key(s.meta, s.store, prefix, "/", "s", b"hot")
        assert found.records and found.windows == len(crashed)
        again = index_stream(s.meta, s.store, prefix, "/", "s", window_ms, lambda keys: None)
        assert again[1] == 0 and again[0].uid == committed.uid  # idempotent
        with pytest.raises(ConfigError, match="same window length"):
            index_stream(s.meta, s.store, prefix, "/", "s", window_ms + 1, lambda keys: None)
    finally:
        s.close()
        reset_process_keyring()


def test_a_deleted_stream_gets_no_key_index(stores: Stores) -> None:
    """Cleanup removes both pointers; a late index job never re-creates them."""
    from tierlog.remote.catalog import Catalog
    from tierlog.remote.errors import StreamDeletedError
    from tierlog.tiering.cleanup import clean_incarnation

    stores.index().commit(add_windows([W1]), stores.schedule)
    clean_incarnation(Catalog(stores.meta), stores.store, "p", "__s_1", None)
    assert stores.meta.get(pointer_key("__s_1")) is None
    with pytest.raises(StreamDeletedError):
        stores.index().commit(add_windows([W2]), stores.schedule)
    assert stores.meta.get(pointer_key("__s_1")) is None
    assert stores.manifests() == []


def test_index_runs_drop_windows_past_the_streams_retention(tmp_path: Path) -> None:
    """A rerun after remote retention moved the stream's first offset drops every window
    whose records are all gone, in the commit that adds new windows; their files go through
    the grace-period queue."""
    from tierlog.remote.catalog import Catalog
    from tierlog.remote.key_index_build import commit_windows, committed_fragments, plan_stream

    s = ColdStream(tmp_path, StreamSettings())
    try:
        publish_keyed(s, batches=30)
        s.tier_and_free()
        prefix, inc = s.tierer.remote.prefix, s.tierer.remote.stream_dir
        catalog = Catalog(s.meta)
        record = catalog.require("/", "s")
        epoch, first, fragments = committed_fragments(catalog, s.store, prefix, inc)
        stamps = sorted(f.min_timestamp for f in fragments)
        window_ms = max(1, (stamps[-1] - stamps[0]) // 4)
        queue = DeletionQueue(s.meta, grace_seconds=0.0)
        plan = plan_stream(
            s.meta,
            s.store,
            prefix,
            record,
            window_ms,
            epoch=epoch,
            first_offset=first,
            fragments=fragments,
        )
        from tierlog.remote.key_index_build import build_task

        built = [build_task(s.store, prefix, t) for t in plan.tasks]
        committed, dropped = commit_windows(plan, built, queue.schedule)
        assert dropped == 0 and len(committed.manifest.windows) == len(built) >= 2
        # retention moved the first offset past the first window's records
        cut = committed.manifest.windows[0].next_offset
        later = plan_stream(
            s.meta,
            s.store,
            prefix,
            record,
            window_ms,
            epoch=epoch,
            first_offset=cut,
            fragments=[f for f in fragments if f.first_offset >= cut] or fragments[-1:],
        )
        after, dropped = commit_windows(later, [], queue.schedule)
        gone = [w for w in committed.manifest.windows if w.next_offset <= cut]
        assert dropped == len(gone) >= 1
        assert all(w.next_offset > cut for w in after.manifest.windows)
        pending = {k for k, _ in queue.pending_keys()}
        assert all(
            any(k.endswith(".kidx") and f"{w.start:020d}" in k for k in pending) for w in gone
        )
        queue.run_due(s.store)
        assert lookup_key(s.meta, s.store, prefix, "/", "s", b"hot").windows == len(
            after.manifest.windows
        )
    finally:
        s.close()


def test_the_index_key_is_a_stream_setting(tmp_path: Path) -> None:
    """``x-tierlog-index-key``: correlation-id, subject or an application property; each
    window remembers the key it was built on, so a change applies to new windows only."""
    from tierlog.remote.key_index_build import index_stream
    from tierlog.server.arguments import settings_changes

    assert settings_changes({"x-tierlog-index-key": "property:order"}) == {
        "index_key": "property:order"
    }
    for bad in ("nope", "property:", "message_id"):
        with pytest.raises(ConfigError, match="index_key"):
            settings_changes({"x-tierlog-index-key": bad})
    with pytest.raises(ConfigError, match="fragments' only"):
        StreamSettings(tier_mode="segments", index_key="subject")

    s = ColdStream(tmp_path, StreamSettings())
    s.catalog.update_settings("/", "s", index_key="property:order")
    try:
        for n in range(400):
            props = {"message_id": f"m-{n}", "correlation_id": f"c-{n % 7}"}
            app = {"order": f"o-{n % 11}"}
            s.log.append([encode_message(b"%d" % n, properties=props, application_properties=app)])
        s.log.sync()
        with LogReader(s.log, OffsetSpec.first()) as reader:
            local = [(o, bytes(r)) for o, r in reader.records()]
        stamps = {}
        with LogReader(s.log, OffsetSpec.first()) as reader:
            for chunk in reader.chunks():
                for o, _ in chunk.records():
                    stamps[o] = chunk.header.timestamp
        s.tier_and_free()
        prefix = s.tierer.remote.prefix
        fragments = list(s.tierer.committer.tree.iter_fragments(s.tierer.remote.load))
        span = fragments[-1].entry.max_timestamp - fragments[0].entry.min_timestamp
        window_ms = max(1, span // 3)
        committed, built, _ = index_stream(
            s.meta, s.store, prefix, "/", "s", window_ms, lambda keys: None
        )
        assert built >= 2 and {w.key for w in committed.manifest.windows} == {"property:order"}
        indexed = committed.manifest.windows[-1].end
        found = lookup_key(s.meta, s.store, prefix, "/", "s", b"o-3").records
        expected = [(o, r) for o, r in local if o % 11 == 3 and stamps[o] < indexed]
        assert found and found == expected[: len(found)] and len(found) == len(expected)
        assert lookup_key(s.meta, s.store, prefix, "/", "s", b"m-3").records == []
    finally:
        s.close()
