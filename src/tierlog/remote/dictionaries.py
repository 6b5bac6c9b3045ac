"""A stream's compression dictionaries in the object store.

Key: ``{prefix}/stream/{stream-dir}/dict/{id}.dict`` (id: 32 hex digits). A dictionary is
written once (create-only put) and read by id from the v2 fragments that name it; it is
sealed like every other object of an encrypted stream. Its key is not a fragment, root or
branch key, so garbage collection reports it as unknown and never deletes it; it goes with
the stream's prefix when the stream is deleted.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import FragmentIndex, FragmentPlacement, encode_fragment
from tierlog.formats.fragment_frames import (
    FrameDecoder,
    validate_fragment,
)
from tierlog.formats.fragment_v2 import (
    NO_DICTIONARY,
    FragmentIndexV2,
    decode_fragment,
    fragment_version,
    stored_sizes,
)
from tierlog.formats.zstd_dictionary import decode_dictionary, encode_dictionary
from tierlog.remote import keys
from tierlog.remote.encryption import Keyring, opener_for
from tierlog.remote.errors import CorruptFragmentError, MissingDictionaryError
from tierlog.remote.sealing import open_object
from tierlog.storage.errors import AlreadyExistsError
from tierlog.storage.object_store import ObjectStore


def dictionary_key(prefix: str, stream_dir: str, dictionary_id: bytes) -> str:
    if len(dictionary_id) != 16:
        raise ValueError("a dictionary id is 16 bytes")
    return f"{keys.stream_prefix(prefix, stream_dir)}dict/{dictionary_id.hex()}.dict"


def dictionary_key_beside(fragment_key: str, dictionary_id: bytes) -> str:
    """The key of a dictionary of the stream that owns ``fragment_key``."""
    stream_part, sep, _name = fragment_key.rpartition("/data/")
    if not sep:
        raise CorruptFragmentError(f"{fragment_key}: not a fragment key")
    return f"{stream_part}/dict/{dictionary_id.hex()}.dict"


def put_dictionary(
    store: ObjectStore,
    key: str,
    dictionary_id: bytes,
    dictionary: bytes,
    keyring: Keyring | None = None,
) -> None:
    """Store a dictionary once (sealed when ``keyring`` is given); an existing object under
    the key (a retried put) is kept."""
    body = encode_dictionary(dictionary_id, dictionary)
    if keyring is not None:
        body = keyring.seal(key, body)
    with contextlib.suppress(AlreadyExistsError):  # a retried put: the same dictionary
        store.put_if_absent(key, body)


def load_dictionary(
    store: ObjectStore, key: str, dictionary_id: bytes, *, sealed: bool = False
) -> bytes:
    """The dictionary bytes under ``key``; typed errors when absent, damaged or foreign.
    ``sealed``: it is named by an encrypted fragment, so a plaintext one is refused."""
    from tierlog.storage.errors import NotFoundError

    try:
        body = store.get(key)
    except NotFoundError:
        raise MissingDictionaryError(f"{key}: dictionary is missing") from None
    try:
        found_id, dictionary = decode_dictionary(open_object(key, body, require_sealed=sealed))
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    if found_id != dictionary_id:
        raise CorruptFragmentError(f"{key}: holds dictionary {found_id.hex()}")
    return dictionary


class DictionaryCache:
    """Dictionaries by key, loaded once (they never change), a few kept."""

    def __init__(self, store: ObjectStore, capacity: int = 16) -> None:
        self.store = store
        self.capacity = capacity
        self._lock = threading.Lock()
        self._held: OrderedDict[str, bytes] = OrderedDict()
        self.loads = 0

    def get(self, key: str, dictionary_id: bytes, *, sealed: bool = False) -> bytes:
        with self._lock:
            found = self._held.get(key)
            if found is not None:
                self._held.move_to_end(key)
                return found
        dictionary = load_dictionary(self.store, key, dictionary_id, sealed=sealed)
        with self._lock:
            self.loads += 1
            self._held[key] = dictionary
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)
        return dictionary


def frame_decoder(
    key: str, index: FragmentIndex, dictionaries: DictionaryCache
) -> FrameDecoder | None:
    """What turns the stored frames of fragment ``key`` back into chunks (None for v1,
    whose frames are the chunks); typed errors when its dictionary or key is unavailable."""
    if not isinstance(index, FragmentIndexV2):
        return None
    dictionary = None
    if index.dictionary_id != NO_DICTIONARY:
        dict_key = dictionary_key_beside(key, index.dictionary_id)
        dictionary = dictionaries.get(dict_key, index.dictionary_id, sealed=index.encrypted)
    try:
        return FrameDecoder(index, dictionary=dictionary, cipher_for=opener_for(key))
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc


def as_v1_fragment(
    store: ObjectStore,
    key: str,
    data: bytes | bytearray | memoryview,
    dictionaries: DictionaryCache | None = None,
    *,
    require_encrypted: bool = False,
) -> bytes | bytearray | memoryview:
    """A whole fragment object with its chunks in the clear: v1 objects as they are, v2 ones
    decoded (frames opened, decompressed and checked) and laid out as the v1 fragment of the
    same chunks, for consumers of whole fragments (Spark). CorruptFragmentError when bad,
    or when ``require_encrypted`` (the stream's manifest is sealed) and it is plaintext."""
    view = memoryview(data).cast("B")
    plaintext = CorruptFragmentError(
        f"{key}: a plaintext fragment where the stream's manifest names encrypted ones only"
    )
    try:
        if fragment_version(view) == 1:
            if require_encrypted:
                raise plaintext
            return data
        index = decode_fragment(view, opener_for(key))
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    if require_encrypted and not (isinstance(index, FragmentIndexV2) and index.encrypted):
        raise plaintext
    decoder = frame_decoder(key, index, dictionaries or DictionaryCache(store))
    assert decoder is not None
    positions = index.records["position"].astype(int).tolist()
    stored = stored_sizes(index).astype(int).tolist()
    chunks: list[bytes] = []
    infos = []
    try:
        for i, (p, s) in enumerate(zip(positions, stored, strict=True)):
            chunks.append(decoder.decode(i, view[p : p + s]))
            infos.append(index.chunk(i)[0])
        t = index.trailer
        placement = FragmentPlacement(t.seq_no, t.segment_first_offset, t.segment_position)
        parts, _ = encode_fragment(placement, chunks, infos)
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    return b"".join(parts)


def validate_stored_fragment(
    store: ObjectStore, key: str, data: bytes | bytearray | memoryview
) -> FragmentIndex:
    """Check a whole v1 or v2 fragment object, every chunk included (v2: with the stream's
    dictionary and key). FormatError when damaged; MissingDictionaryError when a dictionary
    it names is absent; CorruptFragmentError when its dictionary or key is unusable."""
    return validate_fragment(
        data,
        check_chunks=True,
        dictionary_for=lambda dictionary_id: load_dictionary(
            store, dictionary_key_beside(key, dictionary_id), dictionary_id
        ),
        cipher_for=opener_for(key),
    )


def read_chunk_bytes(store: ObjectStore, key: str, index: FragmentIndex) -> bytes:
    """The fragment's chunks back to back, as the local segment held them: one ranged GET
    of the frames, decoded when the fragment is v2. CorruptFragmentError when a frame is bad;
    NotFoundError when the object is gone."""
    start = 8  # the fragment header
    data = store.get(key, start, index.trailer.index_start)
    decoder = frame_decoder(key, index, DictionaryCache(store))
    if decoder is None:
        return data
    view = memoryview(data)
    out = bytearray()
    positions = index.records["position"].astype(int).tolist()
    sizes = stored_sizes(index).astype(int).tolist()
    try:
        for i, (p, s) in enumerate(zip(positions, sizes, strict=True)):
            out += decoder.decode(i, view[p - start : p - start + s])
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    return bytes(out)
