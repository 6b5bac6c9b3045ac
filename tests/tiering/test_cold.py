"""Compressed and encrypted fragments through the real tierer and the cross-tier reader:
chunks come back byte for byte after the local copy is gone; damage, a missing dictionary or
a missing key is a typed error, never wrong data."""

from __future__ import annotations

import base64
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.keyring import process_keyring
from tierlog.formats.chunk import SubBatch
from tierlog.formats.fragment import TRAILER_SIZE
from tierlog.formats.fragment_v2 import FragmentIndexV2, decode_trailer
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import PrefetchConfig, Prefetcher
from tierlog.read.strategies import ReadStrategy
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.errors import EncryptionKeyMissingError
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

KEK = bytes(range(32))


def event_bodies(rng: random.Random, n: int) -> list[bytes]:
    """JSON-like events: repeated field names, skewed values (see benches/cold.py)."""
    kinds = ["page_view"] * 6 + ["click"] * 3 + ["purchase"]
    return [
        json.dumps(
            {
                "event": rng.choice(kinds),
                "user_id": int(rng.paretovariate(1.2) * 100),
                "session_id": f"{rng.getrandbits(48):012x}",
                "page": rng.choice(["/", "/home", "/cart", "/product/42", "/search"]),
                "country": rng.choice(["US"] * 5 + ["DE", "FR", "JP", "BR"]),
                "amount_cents": rng.randrange(100, 50_000),
            }
        ).encode()
        for _ in range(n)
    ]


class ColdStream:
    def __init__(self, root: Path, settings: StreamSettings) -> None:
        self.meta = SqliteMetaStore(str(root / "meta.db"))
        self.catalog = Catalog(self.meta)
        record = self.catalog.create("/", "s", settings)
        self.log = StreamLog.create(
            str(root / "data"),
            "/",
            "s",
            LogConfig(max_segment_bytes=60_000, fsync="never"),
            created_ns=record.created_ns,
        )
        self.store = FsObjectStore(str(root / "objects"))
        self.settings = settings
        config = TieringConfig(
            fragment_bytes=16_000, max_fragment_age=0.1, debounce_count=2, debounce_seconds=0.01
        )
        self.tierer = StreamTierer(
            self.log,
            self.store,
            self.catalog,
            DeletionQueue(self.meta, grace_seconds=0.0),
            config=config,
            settings=lambda: self.settings,
        )
        self.tierer.start()
        self.prefetcher = Prefetcher(PrefetchConfig(request_bytes=4096, max_window_bytes=32768))

    def publish(self, seed: int, batches: int) -> None:
        rng = random.Random(seed)
        for _ in range(batches):
            entries: list[bytes | SubBatch] = list(event_bodies(rng, rng.randint(1, 20)))
            self.log.append(entries)
        self.log.sync()

    def chunks(self) -> list[bytes]:
        with LogReader(self.log, OffsetSpec.first()) as reader:
            out = []
            while (chunk := reader.read_chunk()) is not None:
                out.append(bytes(chunk.raw))
            return out

    def tier_and_free(self) -> None:
        assert self.tierer.flush(30)
        for first in self.tierer.deletable_segments():
            self.log.delete_segment(first)

    def remote_chunks(self) -> list[bytes]:
        manifest = ManifestSource(self.tierer)
        spec = OffsetSpec.first()
        with TieredReader(
            self.log, manifest, spec, strategy=ReadStrategy.FORCE, prefetcher=self.prefetcher
        ) as reader:
            out = []
            while (chunk := reader.read_chunk()) is not None:
                out.append(bytes(chunk.raw))
            return out

    def fragment_keys(self) -> list[str]:
        return sorted(m.key for m in self.store.list() if m.key.endswith(".fragment"))

    def close(self) -> None:
        self.tierer.stop(flush=False, timeout=5)
        self.log.close()
        self.prefetcher.close()
        self.meta.close()


@pytest.fixture
def keyring() -> Iterator[Keyring]:
    with process_keyring(("k1", KEK)) as ring:
        yield ring


def make(tmp_path: Path, **settings: object) -> ColdStream:
    return ColdStream(tmp_path, StreamSettings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "settings",
    [
        {"compression": "zstd"},
        {"compression": "zstd", "dictionary": True, "compression_level": 6},
        {"compression": "zstd", "dictionary": True, "encryption": "aes-256-gcm"},
        {"encryption": "aes-256-gcm"},
    ],
    ids=["zstd", "zstd-dict", "zstd-dict-aes", "aes"],
)
def test_cold_fragments_read_back_byte_for_byte(
    tmp_path: Path, keyring: Keyring, settings: dict[str, object]
) -> None:
    s = make(tmp_path, **settings)
    try:
        s.publish(1, 300)
        original = s.chunks()
        s.tier_and_free()
        assert s.log.list_segments()[0].first_offset > 0  # the head is remote only
        assert s.remote_chunks() == original
        keys = s.fragment_keys()
        assert len(keys) > 3
        tail = s.store.get_suffix(keys[0], TRAILER_SIZE)
        trailer = decode_trailer(tail)
        assert trailer.version == 2  # type: ignore[attr-defined]
        body = s.store.get(keys[0])
        if settings.get("encryption"):
            assert b"page_view" not in body
        if settings.get("compression") == "zstd":
            assert trailer.index_start - 8 < trailer.data_size / 2
        dict_objects = [m.key for m in s.store.list() if m.key.endswith(".dict")]
        assert bool(dict_objects) == bool(settings.get("dictionary"))
        if settings.get("encryption") and dict_objects:
            assert s.store.get(dict_objects[0])[:4] == b"TLSE"
    finally:
        s.close()


def test_v1_and_v2_fragments_mix_in_one_stream(tmp_path: Path) -> None:
    s = make(tmp_path)
    try:
        s.publish(2, 120)
        assert s.tierer.flush(30)
        s.settings = StreamSettings(compression="zstd", dictionary=True)
        s.publish(3, 120)
        original = s.chunks()
        s.tier_and_free()
        versions = {decode_trailer(s.store.get_suffix(k, TRAILER_SIZE)).__class__.__name__
                    for k in s.fragment_keys()}  # fmt: skip
        assert versions == {"FragmentTrailer", "FragmentTrailerV2"}
        assert s.remote_chunks() == original
    finally:
        s.close()


def test_damaged_frame_is_a_typed_error(tmp_path: Path) -> None:
    s = make(tmp_path, compression="zstd")
    try:
        s.publish(4, 200)
        s.tier_and_free()
        key = s.fragment_keys()[1]
        manifest = ManifestSource(s.tierer)
        loc = next(
            loc
            for loc in s.tierer.committer.tree.iter_fragments(s.tierer.remote.load)
            if loc.key == key
        )
        index = manifest.fragment_index(loc)
        assert isinstance(index, FragmentIndexV2)
        data = bytearray(s.store.get(key))
        data[int(index.records["position"][1]) + 5] ^= 0x10
        s.store.put(key, bytes(data))
        with pytest.raises(RemoteDataCorruptError):
            s.remote_chunks()
    finally:
        s.close()


def test_missing_dictionary_and_missing_key_are_typed_errors(
    tmp_path: Path, keyring: Keyring
) -> None:
    s = make(tmp_path, compression="zstd", dictionary=True, encryption="aes-256-gcm")
    try:
        s.publish(5, 200)
        original = s.chunks()
        s.tier_and_free()
        set_process_keyring(Keyring([("other", bytes(32))]))
        with pytest.raises(RemoteDataCorruptError, match="not held"):
            s.remote_chunks()
        set_process_keyring(Keyring([("k2", os.urandom(32)), ("k1", KEK)]))  # rotated
        assert s.remote_chunks() == original
        for meta in list(s.store.list()):
            if meta.key.endswith(".dict"):
                s.store.delete(meta.key)
        with pytest.raises(RemoteDataCorruptError, match="dictionary"):
            s.remote_chunks()
    finally:
        s.close()


def test_encryption_without_a_key_halts_uploads_visibly(tmp_path: Path) -> None:
    reset_process_keyring()
    os.environ.pop("TIERLOG_KEKS", None)
    # the tierer cannot even commit its fencing root (roots are sealed too): it refuses to
    # start with a typed error, and nothing unencrypted goes out
    with pytest.raises(EncryptionKeyMissingError):
        make(tmp_path, encryption="aes-256-gcm")
    store = FsObjectStore(str(tmp_path / "objects"))
    assert [m.key for m in store.list()] == []
    reset_process_keyring()


def test_keyring_from_environment_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERLOG_KEKS", "k9:" + base64.b64encode(KEK).decode())
    reset_process_keyring()
    s = make(tmp_path, encryption="aes-256-gcm")
    try:
        s.publish(7, 60)
        original = s.chunks()
        s.tier_and_free()
        assert s.remote_chunks() == original
    finally:
        s.close()
        reset_process_keyring()


def test_damaged_local_segment_is_repaired_from_v2_fragments(
    tmp_path: Path, keyring: Keyring
) -> None:
    from tierlog.log.errors import DamagedSegmentError
    from tierlog.tiering.segment_repair import repair_from_remote

    s = make(tmp_path, compression="zstd", dictionary=True, encryption="aes-256-gcm")
    s.publish(8, 300)
    assert s.tierer.flush(30)
    first = s.log.list_segments()[0]
    path = os.path.join(s.log.stream_dir, f"{first.first_offset:020d}.segment")
    s.close()
    with open(path, "rb") as f:
        original = f.read()
    damaged = bytearray(original)
    damaged[len(original) // 2] ^= 0xFF  # inside a chunk of a sealed segment
    with open(path, "wb") as f:
        f.write(damaged)
    meta = SqliteMetaStore(str(tmp_path / "meta.db"))
    store = FsObjectStore(str(tmp_path / "objects"))
    error = DamagedSegmentError(
        "planted",
        segment_path=path,
        segment_first_offset=first.first_offset,
        position=len(original) // 2,
        first_offset=first.first_offset,
        end_offset=None,
    )
    try:
        assert repair_from_remote(Catalog(meta), store, "", error) > 0
        with open(path, "rb") as f:
            assert f.read() == original  # decoded frames written back, byte for byte
    finally:
        meta.close()
