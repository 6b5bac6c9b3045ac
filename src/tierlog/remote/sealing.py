"""Sealing of every object a stream owns, when its settings ask for encryption.

One entry point for writers and one for readers, so that no kind of stream-owned object
(manifest roots and branches, dictionaries, key-index files and their manifest, and any kind
added later, such as timer objects) is written in the clear by an encrypted stream:

* ``seal_object(settings, key, plaintext)``: the bytes to store under ``key``. Plaintext as
  it is for a stream without encryption; otherwise the sealed-object layout of
  ``formats.encryption`` (per-object data key wrapped under the current KEK, frames whose
  associated data binds the object key, frame number and last-frame flag).
* ``open_object(key, stored)``: the plaintext back. A stored object that is not sealed is
  returned as it is (objects written before the stream turned encryption on; each kind
  carries its own magic and CRC). A sealed one is opened with the process keyring: a changed,
  reordered, dropped or truncated frame is ``AuthenticationError``, a key block wrapped under
  a KEK the process does not hold is ``UnknownKeyError`` naming the key id, and no keyring at
  all is ``UnknownKeyError`` as well. All are ``FormatError``: readers that already refuse a
  damaged object refuse these the same way, never returning wrong data.

Objects read with ranged GETs (key-index files) use ``seal_ranged`` / ``RangedOpener``:
the same layout with small frames, and the key block kept by the caller (the key-index
manifest holds it), so a range is one GET of the frames covering it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from tierlog.formats.encryption import (
    SEALED_HEADER,
    SEALED_MAGIC,
    SEALED_VERSION,
    TAG_SIZE,
    AesGcmFrameCipher,
    key_block_kek_id,
    open_cipher,
)
from tierlog.formats.encryption import (
    seal_object as seal_frames,
)
from tierlog.formats.errors import (
    AuthenticationError,
    InvalidSizeError,
    TruncatedError,
)
from tierlog.remote.encryption import Keyring, process_keyring
from tierlog.remote.errors import SealingKeyMissingError
from tierlog.remote.settings import StreamSettings

RANGED_FRAME_SIZE = 4096
"""Plaintext bytes per frame of a ranged object: a slot entry costs one 4 KiB frame."""


def is_encrypted(settings: StreamSettings) -> bool:
    return settings.encryption != "none"


def _ring(keyring: Keyring | None, key: str) -> Keyring:
    ring = keyring if keyring is not None else process_keyring()
    if ring is None:
        raise SealingKeyMissingError(
            f"{key}: the stream is encrypted and no key-encryption key is configured"
        )
    return ring


def seal_object(
    settings: StreamSettings,
    key: str,
    plaintext: bytes | bytearray | memoryview,
    *,
    keyring: Keyring | None = None,
) -> bytes:
    """The bytes to store under ``key`` for a stream with ``settings``."""
    if not is_encrypted(settings):
        return bytes(plaintext)
    return seal_frames(plaintext, _ring(keyring, key).new_cipher(key))


def new_object_cipher(
    settings: StreamSettings, key: str, *, keyring: Keyring | None = None
) -> AesGcmFrameCipher | None:
    """The frame cipher of a new object under ``key`` that seals its own frames (offloaded
    segment data objects): a fresh data key wrapped under the current KEK, or None for a
    stream without encryption."""
    if not is_encrypted(settings):
        return None
    return _ring(keyring, key).new_cipher(key)


def open_object_cipher(
    key: str, key_block: bytes, *, keyring: Keyring | None = None
) -> AesGcmFrameCipher:
    """The frame cipher of an existing object under ``key`` from its key block:
    ``UnknownKeyError`` naming the KEK when the process does not hold it."""
    ring = keyring if keyring is not None else process_keyring()
    if ring is None:
        raise SealingKeyMissingError(
            f"{key}: sealed under key {key_block_kek_id(key_block)!r}; no key is configured"
        )
    return open_cipher(key, key_block, ring.keys)


def is_sealed(stored: bytes | bytearray | memoryview) -> bool:
    return bytes(stored[:4]) == SEALED_MAGIC


def open_object(
    key: str,
    stored: bytes | bytearray | memoryview,
    *,
    keyring: Keyring | None = None,
    require_sealed: bool = False,
) -> bytes | bytearray | memoryview:
    """The plaintext of an object read from ``key`` (see the module docstring).

    An object that is not sealed comes back as stored: with a damaged magic it is neither a
    sealed object nor a valid object of its kind, so its own decoder refuses it. Callers
    that know the object must be sealed (it is named by an encrypted object, such as a
    dictionary of an encrypted fragment) pass ``require_sealed`` so that a plaintext object
    put in its place is refused too."""
    if not is_sealed(stored):
        if require_sealed:
            raise AuthenticationError(f"{key}: expected a sealed object, found plaintext")
        return stored
    view = memoryview(stored).cast("B")
    if view.nbytes >= SEALED_HEADER.size:
        ring = keyring if keyring is not None else process_keyring()
        if ring is None:
            _, _, size = SEALED_HEADER.unpack_from(view, 0)
            block = bytes(view[SEALED_HEADER.size : SEALED_HEADER.size + size])
            raise SealingKeyMissingError(
                f"{key}: sealed under key {key_block_kek_id(block)!r}; no key is configured"
            )
        return ring.open(key, bytes(view))
    raise TruncatedError(f"{key}: sealed object of {view.nbytes} bytes is too short")


# ----- ranged objects ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RangedSeal:
    """A ranged-readable sealed object: the stored bytes and what a reader must keep."""

    data: bytes
    key_block: bytes
    frame_size: int
    plaintext_size: int


def seal_ranged(
    settings: StreamSettings,
    key: str,
    plaintext: bytes | bytearray | memoryview,
    *,
    keyring: Keyring | None = None,
    frame_size: int = RANGED_FRAME_SIZE,
) -> RangedSeal | None:
    """``plaintext`` sealed in small frames (None for a stream without encryption)."""
    if not is_encrypted(settings):
        return None
    cipher = _ring(keyring, key).new_cipher(key)
    data = seal_frames(plaintext, cipher, frame_size)
    return RangedSeal(data, cipher.key_block, frame_size, memoryview(plaintext).nbytes)


class RangedOpener:
    """Reads plaintext ranges of a ranged sealed object: one GET of the covering frames."""

    def __init__(
        self,
        key: str,
        key_block: bytes,
        frame_size: int,
        plaintext_size: int,
        *,
        keyring: Keyring | None = None,
    ) -> None:
        if frame_size < 1 or plaintext_size < 0:
            raise InvalidSizeError(f"{key}: frame size {frame_size}, size {plaintext_size}")
        ring = keyring if keyring is not None else process_keyring()
        if ring is None:
            raise SealingKeyMissingError(
                f"{key}: sealed under key {key_block_kek_id(key_block)!r}; no key is configured"
            )
        self.key = key
        self._cipher: AesGcmFrameCipher = open_cipher(key, key_block, ring.keys)
        self._frame_size = frame_size
        self._frames = max(1, -(-plaintext_size // frame_size))
        self._size = plaintext_size
        self._header = (
            SEALED_HEADER.pack(SEALED_MAGIC, SEALED_VERSION, len(key_block))
            + key_block
            + struct.pack(">I", frame_size)
        )
        self._first = len(self._header)

    def read(self, start: int, end: int, get: Callable[[int, int], bytes]) -> bytes:
        """Plaintext ``[start, end)``; ``get(lo, hi)`` reads stored bytes ``[lo, hi)``."""
        if not 0 <= start <= end <= self._size:
            raise InvalidSizeError(f"{self.key}: range {start}..{end} outside {self._size}")
        if start == end:
            return b""
        step = self._frame_size + TAG_SIZE
        lo_frame = start // self._frame_size
        hi_frame = (end - 1) // self._frame_size
        lo = self._first + lo_frame * step
        last_len = min(self._size - hi_frame * self._frame_size, self._frame_size) + TAG_SIZE
        hi = self._first + hi_frame * step + last_len
        stored = get(lo, hi)
        if len(stored) != hi - lo:
            raise TruncatedError(f"{self.key}: read {len(stored)} of {hi - lo} bytes")
        out = bytearray()
        at = 0
        for n in range(lo_frame, hi_frame + 1):
            size = step if n < hi_frame else last_len
            out += self._cipher.open(n, n == self._frames - 1, stored[at : at + size], self._header)
            at += size
        skip = start - lo_frame * self._frame_size
        return bytes(out[skip : skip + end - start])


def key_block_of(stored: bytes | bytearray | memoryview) -> bytes:
    """The key block of a sealed object's stored bytes."""
    view = memoryview(stored).cast("B")
    if view.nbytes < SEALED_HEADER.size:
        raise TruncatedError("sealed object too short")
    _, _, size = SEALED_HEADER.unpack_from(view, 0)
    return bytes(view[SEALED_HEADER.size : SEALED_HEADER.size + size])
