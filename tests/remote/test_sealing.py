"""Sealing of stream-owned objects: round trips, rotation, a missing key named, and any
tampering (flipped byte, swapped / dropped / truncated frame, moved object) refused with a
typed error, never wrong data. Also the manifest roots and branches an encrypted stream's
tierer writes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.formats.encryption import SEALED_HEADER, TAG_SIZE
from tierlog.formats.errors import AuthenticationError, FormatError, UnknownKeyError
from tierlog.formats.manifest import decode_node
from tierlog.remote.committed import read_committed_root
from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring
from tierlog.remote.errors import SealingKeyMissingError
from tierlog.remote.sealing import (
    RangedOpener,
    is_sealed,
    open_object,
    seal_object,
    seal_ranged,
)
from tierlog.remote.settings import StreamSettings
from tierlog.tiering.pointer_recovery import _rebuild

KEK1 = bytes(range(32))
KEK2 = bytes(range(1, 33))
ENCRYPTED = StreamSettings(encryption="aes-256-gcm")
PLAIN = StreamSettings()
RING = Keyring([("k1", KEK1)])


@pytest.fixture
def ring() -> Iterator[Keyring]:
    set_process_keyring(RING)
    yield RING
    reset_process_keyring()


def frames_of(stored: bytes, frame_size: int) -> tuple[bytes, list[bytes]]:
    """(prefix up to the frames, the sealed frames) of a sealed object."""
    _, _, block = SEALED_HEADER.unpack_from(stored, 0)
    at = SEALED_HEADER.size + block + 4
    step = frame_size + TAG_SIZE
    return stored[:at], [stored[i : i + step] for i in range(at, len(stored), step)]


def test_plain_stream_objects_stay_plain(ring: Keyring) -> None:
    assert seal_object(PLAIN, "p/stream/s/x", b"hello") == b"hello"
    assert open_object("p/stream/s/x", b"hello") == b"hello"


def test_round_trip_and_binding_to_the_key(ring: Keyring) -> None:
    data = os.urandom(3000)
    stored = seal_object(ENCRYPTED, "p/stream/s/a", data)
    assert is_sealed(stored) and data not in stored
    assert open_object("p/stream/s/a", stored) == data
    with pytest.raises(AuthenticationError):  # copied under another key
        open_object("p/stream/s/b", stored)


def test_rotation_and_a_missing_key_is_named() -> None:
    old = seal_object(ENCRYPTED, "k", b"old", keyring=RING)
    rotated = Keyring([("k2", KEK2), ("k1", KEK1)])
    new = seal_object(ENCRYPTED, "k", b"new", keyring=rotated)
    assert open_object("k", old, keyring=rotated) == b"old"
    assert open_object("k", new, keyring=rotated) == b"new"
    with pytest.raises(UnknownKeyError, match="'k2'"):
        open_object("k", new, keyring=Keyring([("k1", KEK1)]))
    set_process_keyring(None)
    try:
        with pytest.raises(SealingKeyMissingError, match="'k1'"):
            open_object("k", old)
        with pytest.raises(SealingKeyMissingError):
            seal_object(ENCRYPTED, "k", b"x")
    finally:
        reset_process_keyring()


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=5000),
    where=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_any_flipped_bit_is_refused(data: bytes, where: int, bit: int) -> None:
    stored = bytearray(seal_object(ENCRYPTED, "k", data, keyring=RING))
    at = where % len(stored)
    stored[at] ^= 1 << bit
    with pytest.raises(FormatError):
        open_object("k", bytes(stored), keyring=RING, require_sealed=True)
    try:
        opened = open_object("k", bytes(stored), keyring=RING)
    except FormatError:
        return
    # only a damaged magic gets through, untouched: its kind's own decoder refuses it
    assert at < 4 and opened == bytes(stored)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(min_value=1, max_value=9000), cut=st.integers(min_value=1))
def test_truncation_or_a_dropped_frame_is_refused(size: int, cut: int) -> None:
    stored = seal_object(ENCRYPTED, "k", os.urandom(size), keyring=RING)
    with pytest.raises(FormatError):
        cut_to = len(stored) - 1 - cut % (len(stored) - 1)
        open_object("k", stored[:cut_to], keyring=RING, require_sealed=True)


def test_swapped_dropped_or_appended_frames_are_refused() -> None:
    from tierlog.formats.encryption import new_cipher
    from tierlog.formats.encryption import seal_object as seal_frames

    data = os.urandom(4 * 1000)
    stored = seal_frames(data, new_cipher("k", "k1", KEK1), 1000)
    head, frames = frames_of(stored, 1000)
    assert len(frames) == 4
    variants = [
        head + frames[1] + frames[0] + frames[2] + frames[3],  # swapped
        head + frames[0] + frames[2] + frames[3],  # dropped middle
        head + frames[0] + frames[1] + frames[2],  # last dropped (truncated at a boundary)
        head + b"".join(frames) + frames[3],  # appended
    ]
    for variant in variants:
        with pytest.raises(FormatError):
            open_object("k", variant, keyring=RING)
    other = seal_frames(data, new_cipher("k", "k1", KEK1), 1000)
    _, foreign = frames_of(other, 1000)
    with pytest.raises(AuthenticationError):  # a frame of another object of the same key
        open_object("k", head + frames[0] + foreign[1] + frames[2] + frames[3], keyring=RING)


@settings(max_examples=50, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=20_000),
    a=st.integers(min_value=0),
    b=st.integers(min_value=0),
)
def test_ranged_reads_return_exactly_the_range(size: int, a: int, b: int) -> None:
    data = os.urandom(size)
    sealed = seal_ranged(ENCRYPTED, "k", data, keyring=RING, frame_size=512)
    assert sealed is not None
    start, end = sorted((a % (size + 1), b % (size + 1)))
    opener = RangedOpener("k", sealed.key_block, 512, size, keyring=RING)
    gets: list[tuple[int, int]] = []

    def get(lo: int, hi: int) -> bytes:
        gets.append((lo, hi))
        return sealed.data[lo:hi]

    assert opener.read(start, end, get) == data[start:end]
    assert len(gets) == (1 if end > start else 0)
    assert open_object("k", sealed.data, keyring=RING) == data  # also a whole sealed object


def test_ranged_read_of_tampered_bytes_is_refused() -> None:
    data = os.urandom(4000)
    sealed = seal_ranged(ENCRYPTED, "k", data, keyring=RING, frame_size=512)
    assert sealed is not None
    opener = RangedOpener("k", sealed.key_block, 512, len(data), keyring=RING)
    damaged = bytearray(sealed.data)
    damaged[-3] ^= 1
    with pytest.raises(AuthenticationError):
        opener.read(3990, 4000, lambda lo, hi: bytes(damaged[lo:hi]))
    with pytest.raises(FormatError):  # a short read
        opener.read(0, 10, lambda lo, hi: bytes(sealed.data[lo : hi - 1]))
    assert seal_ranged(PLAIN, "k", data) is None


# ----- manifest roots and branches written by an encrypted stream's tierer ---------------


def test_encrypted_stream_seals_its_manifest(tmp_path: Path, ring: Keyring) -> None:
    from tests.tiering.test_cold import make

    s = make(tmp_path, encryption="aes-256-gcm", manifest_fanout=2)
    s.tierer.committer.m = 2  # small fan-out: branches appear after a few fragments
    try:
        s.publish(11, 300)
        original = s.chunks()
        s.tier_and_free()
        manifest_keys = [m.key for m in s.store.list() if m.key.endswith(".manifest")]
        assert any("/root." in k for k in manifest_keys)
        for key in manifest_keys:
            stored = s.store.get(key)
            assert is_sealed(stored), key
            decode_node(open_object(key, stored))
        assert s.remote_chunks() == original
        inc = s.tierer.remote.stream_dir
        _, root = read_committed_root(s.catalog, s.store, s.tierer.remote.prefix, inc)
        assert root is not None and decode_node(root).header.stream_dir == inc
        # a tampered root is refused by every reader of the committed manifest
        pointer = s.catalog.read_pointer(inc)
        assert pointer is not None and pointer.root_uid is not None
        root_key = s.tierer.remote.root_key(bytes.fromhex(pointer.root_uid))
        damaged = bytearray(s.store.get(root_key))
        damaged[-1] ^= 1
        s.store.put(root_key, bytes(damaged))
        with pytest.raises(AuthenticationError):
            read_committed_root(s.catalog, s.store, s.tierer.remote.prefix, inc)
        # without the key, pointer recovery finds no usable root rather than a wrong one
        set_process_keyring(Keyring([("other", KEK2)]))
        found = _rebuild(s.catalog, s.store, s.tierer.remote.prefix, inc, True)
        assert found.status == "no-roots" and found.root_uid is None
    finally:
        set_process_keyring(RING)
        s.close()


def test_plaintext_dictionary_under_an_encrypted_fragment_is_refused(
    tmp_path: Path, ring: Keyring
) -> None:
    from tests.tiering.test_cold import make
    from tierlog.formats.zstd_dictionary import decode_dictionary, encode_dictionary
    from tierlog.read.errors import RemoteDataCorruptError

    s = make(tmp_path, compression="zstd", dictionary=True, encryption="aes-256-gcm")
    try:
        s.publish(12, 200)
        original = s.chunks()
        s.tier_and_free()
        assert s.remote_chunks() == original
        dict_keys = [m.key for m in s.store.list() if m.key.endswith(".dict")]
        assert dict_keys
        for key in dict_keys:
            stored = s.store.get(key)
            assert is_sealed(stored)
            dictionary_id, dictionary = decode_dictionary(open_object(key, stored))
            s.store.put(key, encode_dictionary(dictionary_id, dictionary))  # a downgrade
        s.tierer.committer.tree.clear_cache()
        with pytest.raises(RemoteDataCorruptError, match="expected a sealed object"):
            make_reader_fresh(s)
    finally:
        s.close()


def make_reader_fresh(s: object) -> list[bytes]:
    """Chunks through a new manifest source (no dictionary cached from earlier reads)."""
    return s.remote_chunks()  # type: ignore[attr-defined, no-any-return]


# ----- downgrade: plaintext manifest objects in place of sealed ones -----------------------


def test_plaintext_manifest_objects_in_place_of_sealed_ones_are_refused(
    tmp_path: Path, ring: Keyring
) -> None:
    """A stream created encrypted has a pointer saying so (in the MetaStore, out of reach
    of someone with bucket access only): a plaintext root, branch or fragment put in the
    place of a sealed one is refused by every reader, never read."""
    from tests.tiering.test_cold import make
    from tierlog.read.errors import RemoteDataCorruptError
    from tierlog.remote.committed import load_committed_tree
    from tierlog.remote.dictionaries import DictionaryCache, as_v1_fragment
    from tierlog.remote.errors import CorruptFragmentError
    from tierlog.remote.manifest_walk import Bounds
    from tierlog.spark.jobs.common import walk_manifest
    from tierlog.spark.jobs.scrub import check_fragment
    from tierlog.spark.planning import coalesce, plan_stream
    from tierlog.spark.reading import ReadSettings, read_task

    s = make(tmp_path, encryption="aes-256-gcm", manifest_fanout=2)
    s.tierer.committer.m = 2
    try:
        s.publish(12, 300)
        original = s.chunks()
        s.tier_and_free()
        inc, prefix = s.tierer.remote.stream_dir, s.tierer.remote.prefix
        pointer = s.catalog.read_pointer(inc)
        assert pointer is not None and pointer.sealed and pointer.root_uid is not None
        walk = walk_manifest(s.store, s.catalog, prefix, inc)
        assert walk.problems == [] and walk.branch_keys
        victim = walk.branch_keys[0]
        sealed_branch = s.store.get(victim)
        s.store.put(victim, bytes(open_object(victim, sealed_branch)))  # a valid plaintext
        _, tree = load_committed_tree(s.catalog, s.store, prefix, inc, 2)
        assert tree.sealed
        with pytest.raises(AuthenticationError, match="expected a sealed object"):
            list(tree.iter_fragments(s.store.get))
        problems = walk_manifest(s.store, s.catalog, prefix, inc).problems
        assert [p["kind"] for p in problems] == ["corrupt-branch"]
        s.store.put(victim, sealed_branch)
        root_key = s.tierer.remote.root_key(bytes.fromhex(pointer.root_uid))
        sealed_root = s.store.get(root_key)
        s.store.put(root_key, bytes(open_object(root_key, sealed_root)))
        with pytest.raises(AuthenticationError, match="expected a sealed object"):
            read_committed_root(s.catalog, s.store, prefix, inc)
        s.store.put(root_key, sealed_root)
        assert s.remote_chunks() == original
        # a v1 (plaintext) fragment of the very same chunks in the place of a sealed one
        fragment = s.fragment_keys()[0]
        sealed_fragment = s.store.get(fragment)
        plaintext = as_v1_fragment(s.store, fragment, sealed_fragment, DictionaryCache(s.store))
        s.store.put(fragment, bytes(plaintext))
        s.tierer.committer.tree.clear_cache()
        with pytest.raises(RemoteDataCorruptError, match="plaintext fragment"):
            s.remote_chunks()
        entry = next(e for e in walk_manifest(s.store, s.catalog, prefix, inc).fragments)
        problem = check_fragment(s.store, entry, sealed=True)
        assert problem is not None and "plaintext fragment" in problem["detail"]
        _, tree = load_committed_tree(s.catalog, s.store, prefix, inc, 2)
        task = coalesce(plan_stream("s", tree, s.store.get, Bounds()), Bounds(), 1 << 40)[0]
        assert task.sealed and task.fragments[0].key == fragment
        where = ReadSettings(f"file://{tmp_path / 'objects'}", (), False, False, True, None)
        with pytest.raises(CorruptFragmentError, match="plaintext fragment"):
            list(read_task(task, where))  # the Spark source's executor side
        s.store.put(fragment, sealed_fragment)
        assert s.remote_chunks() == original
    finally:
        s.close()


def test_streams_not_created_encrypted_keep_reading_plaintext(
    tmp_path: Path, ring: Keyring
) -> None:
    """Compatibility: a stream without encryption keeps a pointer without the flag, and one
    that turned encryption on later (its older branches are plaintext) is not flagged."""
    from tests.tiering.test_cold import make

    s = make(tmp_path, manifest_fanout=2)
    s.tierer.committer.m = 2
    try:
        s.publish(13, 150)
        before = s.chunks()
        s.tier_and_free()
        inc = s.tierer.remote.stream_dir
        value = s.meta.get(f"pointer/{inc}")
        assert value is not None and b"sealed" not in value.value
        s.settings = ENCRYPTED  # turned on: new objects sealed, old ones stay readable
        s.publish(14, 150)
        original = before + [c for c in s.chunks() if c not in set(before)]
        s.tier_and_free()
        pointer = s.catalog.read_pointer(inc)
        assert pointer is not None and not pointer.sealed and pointer.root_uid is not None
        assert is_sealed(s.store.get(s.tierer.remote.root_key(bytes.fromhex(pointer.root_uid))))
        assert s.remote_chunks() == original
    finally:
        s.close()
