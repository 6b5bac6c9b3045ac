"""The ObjectStore contract, run against every backend: filesystem and SeaweedFS S3."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tierlog.storage.errors import (
    AlreadyExistsError,
    InvalidKeyError,
    InvalidMetadataError,
    InvalidRangeError,
    NotFoundError,
    PermanentError,
)
from tierlog.storage.object_store import (
    MAX_KEY_BYTES,
    MAX_SEGMENT_BYTES,
    MIN_PART_SIZE,
    ObjectStore,
)

DATA = bytes(range(256)) * 4  # 1024 distinct-ish bytes

BAD_KEYS = [
    "",
    "/abs/key",
    "../escape",
    "a/../../escape",
    "a/./b",
    "a//b",
    "trailing/",
    "back\\slash",
    "nul\x00byte",
    "x" * (MAX_KEY_BYTES + 1),
    "a/" + "x" * (MAX_SEGMENT_BYTES + 1),
]


# -- put / get / head ------------------------------------------------------------------------


def test_put_then_get_whole_and_head(object_store: ObjectStore) -> None:
    meta = object_store.put("a/b/obj", DATA)
    assert meta.key == "a/b/obj" and meta.size == len(DATA)
    assert object_store.get("a/b/obj") == DATA
    head = object_store.head("a/b/obj")
    assert head.size == len(DATA) and head.etag


def test_put_overwrites_and_accepts_any_buffer(object_store: ObjectStore) -> None:
    object_store.put("k", b"first version")
    object_store.put("k", memoryview(bytearray(b"second")))
    assert object_store.get("k") == b"second"
    assert object_store.head("k").size == 6


def test_empty_object(object_store: ObjectStore) -> None:
    object_store.put("empty", b"")
    assert object_store.get("empty") == b""
    assert object_store.get("empty", 0, 10) == b""
    assert object_store.get_suffix("empty", 5) == b""
    assert object_store.head("empty").size == 0


def test_key_and_its_extension_coexist(object_store: ObjectStore) -> None:
    object_store.put("a", b"file")
    object_store.put("a/b", b"below")
    object_store.put("a_c", b"sibling")
    assert object_store.get("a") == b"file"
    assert object_store.get("a/b") == b"below"
    assert [m.key for m in object_store.list()] == ["a", "a/b", "a_c"]
    object_store.delete("a")
    assert object_store.get("a/b") == b"below"


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 10, DATA[0:10]),
        (100, 356, DATA[100:356]),
        (1000, 2000, DATA[1000:]),  # range past the end: clamped
        (len(DATA) - 1, None, DATA[-1:]),
        (None, 5, DATA[:5]),
        (10, None, DATA[10:]),
        (5, 5, b""),  # zero length
        (9, 3, b""),  # inverted
        (len(DATA), len(DATA) + 10, b""),  # starts exactly at the end
        (5000, 6000, b""),  # starts past the end
    ],
)
def test_ranged_get(
    object_store: ObjectStore, start: int | None, end: int | None, expected: bytes
) -> None:
    object_store.put("r", DATA)
    assert object_store.get("r", start, end) == expected


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 10, DATA[:10]),
        (1000, 2000, DATA[1000:]),
        (5000, 6000, b""),
        (7, 7, b""),
        (3, None, DATA[3:]),
    ],
)
def test_get_view(
    object_store: ObjectStore, start: int | None, end: int | None, expected: bytes
) -> None:
    object_store.put("v", DATA)
    view = object_store.get_view("v", start, end)
    assert isinstance(view, memoryview) and view == expected
    with pytest.raises(NotFoundError):
        object_store.get_view("missing", 0, 10)


@pytest.mark.parametrize("length", [0, 1, 48, len(DATA), len(DATA) + 1, 10 * len(DATA)])
def test_suffix_get(object_store: ObjectStore, length: int) -> None:
    object_store.put("s", DATA)
    assert object_store.get_suffix("s", length) == (DATA[-length:] if length else b"")


def test_negative_ranges_are_rejected(object_store: ObjectStore) -> None:
    object_store.put("neg", DATA)
    with pytest.raises(InvalidRangeError):
        object_store.get("neg", -1, 10)
    with pytest.raises(InvalidRangeError):
        object_store.get_suffix("neg", -5)


def test_missing_keys_raise_not_found(object_store: ObjectStore) -> None:
    for call in (
        lambda: object_store.get("missing"),
        lambda: object_store.get("missing", 0, 10),
        lambda: object_store.get("missing", 3, 3),
        lambda: object_store.get("missing", 10, None),
        lambda: object_store.get_suffix("missing", 8),
        lambda: object_store.get_suffix("missing", 0),
        lambda: object_store.head("missing"),
        lambda: object_store.get("no/such/dir/key"),
    ):
        with pytest.raises(NotFoundError) as info:
            call()
        assert "missing" in str(info.value) or "no/such" in str(info.value)


# -- create-only -----------------------------------------------------------------------------


def test_put_if_absent_creates_once(object_store: ObjectStore) -> None:
    object_store.put_if_absent("once", b"original")
    with pytest.raises(AlreadyExistsError):
        object_store.put_if_absent("once", b"intruder")
    assert object_store.get("once") == b"original"


def test_put_if_absent_after_delete_succeeds(object_store: ObjectStore) -> None:
    object_store.put_if_absent("again", b"1")
    object_store.delete("again")
    object_store.put_if_absent("again", b"2")
    assert object_store.get("again") == b"2"


def test_racing_creators_exactly_one_wins(object_store: ObjectStore) -> None:
    writers = 8
    barrier = threading.Barrier(writers)

    def create(i: int) -> bool:
        payload = f"writer-{i}-".encode() * 1000
        barrier.wait()
        try:
            object_store.put_if_absent("contended/key", payload)
            return True
        except AlreadyExistsError:
            return False

    with ThreadPoolExecutor(writers) as pool:
        results = list(pool.map(create, range(writers)))
    assert results.count(True) == 1
    winner = results.index(True)
    assert object_store.get("contended/key") == f"writer-{winner}-".encode() * 1000


# -- list ------------------------------------------------------------------------------------


def test_list_sorted_by_prefix_and_start_after(object_store: ObjectStore) -> None:
    keys = ["p/b", "p/a", "p/a/x", "p/ab", "p/c/d/e", "q/z", "p0", "pz", "p/a_b", "p/a/y/z"]
    for k in keys:
        object_store.put(k, k.encode())
    assert [m.key for m in object_store.list()] == sorted(keys)
    assert [m.key for m in object_store.list("p/")] == sorted(k for k in keys if k[:2] == "p/")
    assert [m.key for m in object_store.list("p/a")] == [
        "p/a",
        "p/a/x",
        "p/a/y/z",
        "p/a_b",
        "p/ab",
    ]
    assert [m.key for m in object_store.list("p/a/")] == ["p/a/x", "p/a/y/z"]
    assert [m.key for m in object_store.list("p")] == sorted(k for k in keys if k[0] == "p")
    assert [m.key for m in object_store.list("p/", start_after="p/a/x")] == [
        "p/a/y/z",
        "p/a_b",
        "p/ab",
        "p/b",
        "p/c/d/e",
    ]
    after = [m.key for m in object_store.list("", start_after="p/c/d/e")]
    assert after == ["p0", "pz", "q/z"]
    assert list(object_store.list("nothing/")) == []
    assert list(object_store.list("p/zz")) == []
    sizes = {m.key: m.size for m in object_store.list("p/c")}
    assert sizes == {"p/c/d/e": len(b"p/c/d/e")}


def test_list_order_with_bytes_below_slash(object_store: ObjectStore) -> None:
    """Segment bytes below '/' ('-', '.') order differently in byte order (AWS S3, fs) and
    directory-tree order (SeaweedFS); both are sorted, and each key comes exactly once."""
    keys = ["s/a", "s/a-z", "s/a-z/1", "s/a.b", "s/a/x", "s/ab"]
    for k in keys:
        object_store.put(k, b"")
    listed = [m.key for m in object_store.list("s/")]
    tree_order = sorted(keys, key=lambda k: k.split("/"))
    assert listed in (sorted(keys), tree_order)
    assert [m.key for m in object_store.list("s/a-")] == ["s/a-z", "s/a-z/1"]


def test_list_is_lazy_and_skips_deleted(object_store: ObjectStore) -> None:
    for i in range(5):
        object_store.put(f"lazy/{i}", b"x")
    it = object_store.list("lazy/")
    assert next(it).key == "lazy/0"
    object_store.delete("lazy/4")
    rest = [m.key for m in it]
    assert rest[:3] == ["lazy/1", "lazy/2", "lazy/3"]


def test_list_paginates_past_1000_keys(object_store: ObjectStore) -> None:
    keys = [f"many/{i:05d}" for i in range(1234)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: object_store.put(k, b""), keys))
    listed = [m.key for m in object_store.list("many/")]
    assert listed == keys
    assert [m.key for m in object_store.list("many/", start_after="many/01100")] == keys[1101:]
    object_store.delete_many(keys)
    assert list(object_store.list("many/")) == []


def test_list_bad_prefix(object_store: ObjectStore) -> None:
    with pytest.raises(InvalidKeyError):
        list(object_store.list("../"))


# -- delete ----------------------------------------------------------------------------------


def test_delete_and_delete_missing(object_store: ObjectStore) -> None:
    object_store.put("d/1", b"1")
    object_store.put("d/2", b"2")
    object_store.delete("d/1")
    object_store.delete("d/1")  # already gone: fine
    object_store.delete("never/existed")
    with pytest.raises(NotFoundError):
        object_store.get("d/1")
    assert [m.key for m in object_store.list()] == ["d/2"]


def test_delete_many_with_missing_keys(object_store: ObjectStore) -> None:
    for i in range(10):
        object_store.put(f"m/{i}", b"x")
    object_store.delete_many([f"m/{i}" for i in range(0, 10, 2)] + ["m/missing"])
    assert [m.key for m in object_store.list("m/")] == [f"m/{i}" for i in range(1, 10, 2)]
    object_store.delete_many([])


# -- multipart -------------------------------------------------------------------------------


def test_multipart_parts_are_exact(object_store: ObjectStore) -> None:
    part1 = os.urandom(MIN_PART_SIZE)
    part2 = os.urandom(MIN_PART_SIZE + 123)
    part3 = b"tail"
    upload = object_store.create_multipart("mp/object")
    upload.put_part(2, part2)  # any order
    upload.put_part(1, b"will be replaced" * 100)
    upload.put_part(3, part3)
    upload.put_part(1, part1)
    with pytest.raises(NotFoundError):
        object_store.head("mp/object")  # nothing visible before complete
    meta = upload.complete()
    assert meta.size == len(part1) + len(part2) + len(part3)
    assert object_store.get("mp/object", 0, MIN_PART_SIZE) == part1
    assert object_store.get("mp/object", MIN_PART_SIZE, 2 * MIN_PART_SIZE + 123) == part2
    assert object_store.get_suffix("mp/object", 4) == part3


def test_multipart_abort_leaves_nothing(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("mp/aborted")
    upload.put_part(1, b"x" * 100)
    upload.abort()
    with pytest.raises(NotFoundError):
        object_store.head("mp/aborted")
    assert list(object_store.list()) == []
    with pytest.raises(PermanentError):
        upload.complete()


def test_multipart_rejects_small_middle_parts_and_bad_numbers(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("mp/bad")
    with pytest.raises(InvalidRangeError):
        upload.complete()  # no parts
    with pytest.raises(InvalidRangeError):
        upload.put_part(0, b"x")
    with pytest.raises(InvalidRangeError):
        upload.put_part(10_001, b"x")
    with pytest.raises(InvalidRangeError):
        upload.put_part(1, b"")
    upload.put_part(1, b"too small")
    upload.put_part(2, b"last")
    with pytest.raises(InvalidRangeError):
        upload.complete()
    upload.abort()
    with pytest.raises(NotFoundError):
        object_store.head("mp/bad")


def test_single_part_multipart(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("mp/single")
    upload.put_part(1, b"only part")
    assert upload.complete().size == 9
    assert object_store.get("mp/single") == b"only part"


# -- bad keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k)[:20])
def test_bad_keys_rejected_everywhere(object_store: ObjectStore, key: str) -> None:
    for call in (
        lambda: object_store.put(key, b"x"),
        lambda: object_store.put_if_absent(key, b"x"),
        lambda: object_store.get(key),
        lambda: object_store.get_suffix(key, 1),
        lambda: object_store.head(key),
        lambda: object_store.delete(key),
        lambda: object_store.delete_many(["fine", key]),
        lambda: object_store.create_multipart(key),
    ):
        with pytest.raises(InvalidKeyError):
            call()
    assert list(object_store.list()) == []


def test_long_keys(object_store: ObjectStore) -> None:
    key = "/".join(["k" * MAX_SEGMENT_BYTES] * 3) + "/" + "k" * 200  # 952 bytes: fits a prefix
    object_store.put(key, b"long")
    assert object_store.get(key) == b"long"
    assert [m.key for m in object_store.list()] == [key]


# -- user metadata ---------------------------------------------------------------------------

META = {"tierlog-offload-format-version": "1", "stream": "s_1", "note": "a b/c:d=e"}


def test_user_metadata_on_put_create_and_head(object_store: ObjectStore) -> None:
    object_store.put("um/put", b"x", metadata=META)
    assert object_store.head("um/put").metadata == META
    object_store.put_if_absent("um/create", b"y", metadata={"k": "v"})
    assert object_store.head("um/create").metadata == {"k": "v"}
    object_store.put("um/plain", b"z")
    assert object_store.head("um/plain").metadata == {}
    object_store.put("um/put", b"again")  # an overwrite replaces the metadata too
    assert object_store.head("um/put").metadata == {}
    assert object_store.get("um/create") == b"y"


def test_user_metadata_on_multipart(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("um/mp", metadata=META)
    upload.put_part(1, b"p" * MIN_PART_SIZE)
    upload.put_part(2, b"q")
    upload.complete()
    head = object_store.head("um/mp")
    assert head.size == MIN_PART_SIZE + 1 and head.metadata == META


@pytest.mark.parametrize(
    "metadata",
    [
        {"Upper": "v"},
        {"": "v"},
        {"k_y": "v"},
        {"k": "caf\u00e9"},
        {"k": "line\nbreak"},
        {"k": "v" * 3000},
    ],
)
def test_bad_user_metadata_rejected(object_store: ObjectStore, metadata: dict[str, str]) -> None:
    for call in (
        lambda: object_store.put("um/bad", b"x", metadata=metadata),
        lambda: object_store.put_if_absent("um/bad", b"x", metadata=metadata),
        lambda: object_store.create_multipart("um/bad", metadata=metadata),
    ):
        with pytest.raises(InvalidMetadataError):
            call()
    assert list(object_store.list()) == []
    assert list(object_store.list_multipart_uploads()) == []


# -- uploads left behind ---------------------------------------------------------------------


def test_list_and_abort_pending_multipart_uploads(object_store: ObjectStore) -> None:
    a = object_store.create_multipart("pending/a")
    a.put_part(1, b"part")
    b = object_store.create_multipart("pending/b")
    done = object_store.create_multipart("pending/done")
    done.put_part(1, b"d")
    done.complete()
    aborted = object_store.create_multipart("pending/aborted")
    aborted.abort()
    other = object_store.create_multipart("elsewhere/c")
    listed = list(object_store.list_multipart_uploads("pending/"))
    assert [(u.key, u.upload_id) for u in listed] == [
        ("pending/a", a.upload_id),
        ("pending/b", b.upload_id),
    ]
    assert all(u.initiated is None or u.initiated > 0 for u in listed)
    assert {u.key for u in object_store.list_multipart_uploads()} == {
        "pending/a",
        "pending/b",
        "elsewhere/c",
    }
    object_store.abort_multipart("pending/a", a.upload_id)
    object_store.abort_multipart("pending/a", a.upload_id)  # already gone: fine
    with pytest.raises((PermanentError, NotFoundError)):  # aborted elsewhere
        a.complete()
    assert [u.key for u in object_store.list_multipart_uploads("pending/")] == ["pending/b"]
    object_store.abort_multipart("pending/b", b.upload_id)
    object_store.abort_multipart("elsewhere/c", other.upload_id)
    assert list(object_store.list_multipart_uploads()) == []
    with pytest.raises(NotFoundError):
        object_store.head("pending/a")
    assert [m.key for m in object_store.list()] == ["pending/done"]
