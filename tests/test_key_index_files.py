"""Key index files built from a stream's real fragments (v1 and compressed v2): a lookup
returns exactly the records with that message-id, with two ranged GETs of the index per
window plus the record's frame (and, for v2, the fragment's index once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cold_tiering import ColdStream
from tierlog.formats.amqp import encode_message
from tierlog.formats.chunk import SubBatch
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.remote.key_index_files import (
    build_window,
    list_index_files,
    lookup_records,
    message_id_key,
)
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore


class CountingStore(FsObjectStore):
    gets: list[tuple[str, int | None]] = []

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        CountingStore.gets.append((key, start))
        return super().get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        CountingStore.gets.append((key, -length))
        return super().get_suffix(key, length)


@pytest.mark.parametrize("settings", [{}, {"compression": "zstd", "dictionary": True}])
def test_lookup_by_message_id(tmp_path: Path, settings: dict[str, object]) -> None:
    s = ColdStream(tmp_path, StreamSettings(**settings))  # type: ignore[arg-type]
    try:
        n = 0
        for _batch in range(60):
            entries: list[bytes | SubBatch] = []
            for _ in range(25):
                entries.append(
                    encode_message(b'{"n":%d}' % n, properties={"message_id": f"order-{n % 97}"})
                )
                n += 1
            s.log.append(entries)
        s.log.sync()
        with LogReader(s.log, OffsetSpec.first()) as reader:
            local = [(o, bytes(r)) for o, r in reader.records()]
        s.tier_and_free()
        tree = s.tierer.committer.tree
        fragments = [loc.entry for loc in tree.iter_fragments(s.tierer.remote.load)]
        stamps = sorted({f.min_timestamp for f in fragments} | {f.max_timestamp for f in fragments})
        cut = stamps[len(stamps) // 2]
        windows = [(0, cut), (cut, 1 << 62)]
        prefix, stream_dir = s.tierer.remote.prefix, s.tierer.remote.stream_dir
        for start, end in windows:
            build_window(s.store, prefix, stream_dir, "s", fragments, start, end)
        files = list_index_files(s.store, prefix, stream_dir)
        assert len(files) == 2 and sum(f.item_count for f in files) == len(local)
        counting = CountingStore(str(tmp_path / "objects"))
        for key in (b"order-5", b"order-96", b"order-1000"):
            expected = [(o, r) for o, r in local if message_id_key(memoryview(r)) == key]
            got: list[tuple[int, bytes]] = []
            for f in files:
                CountingStore.gets = []
                found = lookup_records(counting, prefix, stream_dir, "s", f, key)
                index_gets = [g for g in CountingStore.gets if g[0] == f.key]
                assert len(index_gets) <= 2  # slot entry, then the slot's items
                data = [g for g in CountingStore.gets if g[0] != f.key]
                fragments_read = {k for k, _ in data}
                # one GET per record at most (records of one chunk share it); v2 fragments
                # also need their index once (trailer + index)
                per_fragment = 2 if settings else 0
                assert len(data) <= len(found) + per_fragment * len(fragments_read)
                got.extend(found)
            assert sorted(got) == expected
    finally:
        s.close()


def test_gc_never_takes_dictionaries_or_key_index_files_for_its_own() -> None:
    """gc deletes only keys it parses (fragments, roots, branches); these stay 'unknown'."""
    from tierlog.remote import keys
    from tierlog.remote.dictionaries import dictionary_key
    from tierlog.storage.errors import InvalidKeyError

    for key in (
        dictionary_key("p", "__s_1", b"\x01" * 16),
        "p/stream/__s_1/kindex/00000000000000000000.5.17.kidx",
    ):
        with pytest.raises(InvalidKeyError):
            keys.parse_key(key, "p")
