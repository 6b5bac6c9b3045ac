"""Client-side encryption of a stream's objects: AES-256-GCM per frame, per-object data keys
wrapped by a key-encryption key (KEK).

Each object gets a fresh random 256-bit data key. It is stored in the object's key block,
wrapped (AES-256-GCM) by a KEK named by id, with the object key as associated data, so a key
block copied into another object does not open. Frames are sealed with the data key; the
nonce is the frame number (a data key seals exactly one object, so a nonce never repeats
under a key), and the associated data binds the object key, the frame number and a last-frame
flag: frames cannot be reordered, dropped, truncated or moved to another object unnoticed.

Key block layout (big-endian)::

    u8 version 1, u8 KEK id length, KEK id (ASCII), 12-byte wrap nonce, 48-byte wrapped key

A sealed object (any object a stream owns that is not a fragment; fragments seal their own
frames) is laid out as::

    "TLSE" + u32 version 2 + u16 key block size + key block + u32 frame size + frames

where every frame but the last holds ``frame size`` plaintext bytes plus the 16-byte tag.
Each frame's associated data also covers every byte before the frames (version 1, still
read, covered only the first 10), so no header field can be edited unnoticed.

The ``cryptography`` package (extra ``crypto``) is imported when a key is first used.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from tierlog.formats.errors import (
    AuthenticationError,
    BadMagicError,
    InvalidSizeError,
    TruncatedError,
    UnknownKeyError,
    UnsupportedError,
)

KEY_SIZE = 32
TAG_SIZE = 16
NONCE_SIZE = 12
KEY_BLOCK_VERSION = 1
WRAPPED_KEY_SIZE = KEY_SIZE + TAG_SIZE
MAX_KEK_ID = 64
KEK_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

SEALED_MAGIC = b"TLSE"
SEALED_VERSION = 2
SEALED_VERSIONS = (1, 2)
SEALED_HEADER = struct.Struct(">4sIH")
DEFAULT_FRAME_SIZE = 1 << 20

_FRAME_AAD = b"tierlog-frame\x00"
_WRAP_AAD = b"tierlog-data-key\x00"


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - dependency is declared in the extra
        raise UnsupportedError("encryption needs the cryptography package (extra crypto)") from exc
    return AESGCM(key)


def check_kek(kek_id: str, kek: bytes) -> None:
    """Reject a KEK id that is not a short ASCII name or a key that is not 256 bits."""
    if not KEK_ID.match(kek_id):
        raise InvalidSizeError(f"key id {kek_id!r} must be 1-64 of [A-Za-z0-9._-]")
    if len(kek) != KEY_SIZE:
        raise InvalidSizeError(f"key {kek_id!r} is {len(kek)} bytes, AES-256 needs {KEY_SIZE}")


class AesGcmFrameCipher:
    """The frame cipher of one object: its key, its data key and its key block."""

    __slots__ = ("_aead", "_key_block", "_object_key")

    def __init__(self, object_key: str, data_key: bytes, key_block: bytes) -> None:
        if len(data_key) != KEY_SIZE:
            raise InvalidSizeError(f"data key is {len(data_key)} bytes, not {KEY_SIZE}")
        encoded = object_key.encode()
        self._object_key = struct.pack(">H", len(encoded)) + encoded
        self._aead = _aesgcm(data_key)
        self._key_block = key_block

    @property
    def overhead(self) -> int:
        return TAG_SIZE

    @property
    def key_block(self) -> bytes:
        return self._key_block

    def _aad(self, frame_no: int, last: bool, extra: bytes) -> bytes:
        return _FRAME_AAD + self._object_key + struct.pack(">QB", frame_no, last) + extra

    def seal(
        self,
        frame_no: int,
        last: bool,
        plaintext: bytes | bytearray | memoryview,
        extra_aad: bytes = b"",
    ) -> bytes:
        nonce = struct.pack(">IQ", 0, frame_no)
        return bytes(self._aead.encrypt(nonce, plaintext, self._aad(frame_no, last, extra_aad)))

    def open(
        self,
        frame_no: int,
        last: bool,
        sealed: bytes | bytearray | memoryview,
        extra_aad: bytes = b"",
    ) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(sealed) < TAG_SIZE:
            raise TruncatedError(f"sealed frame {frame_no} of {len(sealed)} bytes has no tag")
        nonce = struct.pack(">IQ", 0, frame_no)
        try:
            return bytes(self._aead.decrypt(nonce, sealed, self._aad(frame_no, last, extra_aad)))
        except InvalidTag:
            raise AuthenticationError(
                f"frame {frame_no} (last={last}) does not authenticate"
            ) from None


def new_cipher(
    object_key: str,
    kek_id: str,
    kek: bytes,
    *,
    random: Callable[[int], bytes] = os.urandom,
) -> AesGcmFrameCipher:
    """A cipher for a new object: a fresh data key, wrapped by ``kek`` into the key block."""
    check_kek(kek_id, kek)
    data_key = random(KEY_SIZE)
    nonce = random(NONCE_SIZE)
    ident = kek_id.encode()
    wrapped = _aesgcm(kek).encrypt(nonce, data_key, _WRAP_AAD + object_key.encode())
    block = struct.pack(">BB", KEY_BLOCK_VERSION, len(ident)) + ident + nonce + wrapped
    return AesGcmFrameCipher(object_key, data_key, block)


def key_block_kek_id(key_block: bytes) -> str:
    """The id of the KEK a key block was wrapped with."""
    if len(key_block) < 2:
        raise TruncatedError("key block too short")
    version, length = key_block[0], key_block[1]
    if version != KEY_BLOCK_VERSION:
        raise UnsupportedError(f"key block version {version} not supported")
    if not 1 <= length <= MAX_KEK_ID or len(key_block) != 2 + length + NONCE_SIZE + (
        WRAPPED_KEY_SIZE
    ):
        raise InvalidSizeError(f"key block of {len(key_block)} bytes is malformed")
    return key_block[2 : 2 + length].decode("ascii", errors="replace")


def open_cipher(object_key: str, key_block: bytes, keks: Mapping[str, bytes]) -> AesGcmFrameCipher:
    """The cipher of an existing object from its key block and the configured KEKs."""
    from cryptography.exceptions import InvalidTag

    kek_id = key_block_kek_id(key_block)
    kek = keks.get(kek_id)
    if kek is None:
        raise UnknownKeyError(f"object {object_key!r} is sealed under key {kek_id!r}, not held")
    at = 2 + len(kek_id.encode())
    nonce = key_block[at : at + NONCE_SIZE]
    wrapped = key_block[at + NONCE_SIZE :]
    try:
        data_key = _aesgcm(kek).decrypt(nonce, wrapped, _WRAP_AAD + object_key.encode())
    except InvalidTag:
        raise AuthenticationError(
            f"data key of {object_key!r} does not unwrap under {kek_id!r}"
        ) from None
    return AesGcmFrameCipher(object_key, data_key, key_block)


def seal_object(
    data: bytes | bytearray | memoryview,
    cipher: AesGcmFrameCipher,
    frame_size: int = DEFAULT_FRAME_SIZE,
) -> bytes:
    """A whole object sealed in frames of ``frame_size`` plaintext bytes (an empty object
    is one empty last frame)."""
    if not 1 <= frame_size <= 0xFFFFFFFF:
        raise InvalidSizeError(f"frame size {frame_size}")
    view = memoryview(data).cast("B")
    block = cipher.key_block
    out = bytearray(SEALED_HEADER.pack(SEALED_MAGIC, SEALED_VERSION, len(block)))
    out += block + struct.pack(">I", frame_size)
    prefix = bytes(out)  # the associated data of every frame (version 2)
    count = max(1, -(-view.nbytes // frame_size))
    for n in range(count):
        piece = bytes(view[n * frame_size : (n + 1) * frame_size])
        out += cipher.seal(n, n == count - 1, piece, prefix)
    return bytes(out)


def open_object(
    data: bytes | bytearray | memoryview, object_key: str, keks: Mapping[str, bytes]
) -> bytes:
    """The plaintext of a sealed object; AuthenticationError when any frame was changed,
    reordered, dropped or taken from another object."""
    view = memoryview(data).cast("B")
    if view.nbytes < SEALED_HEADER.size + 4:
        raise TruncatedError(f"sealed object of {view.nbytes} bytes is too short")
    magic, version, block_size = SEALED_HEADER.unpack_from(view, 0)
    if magic != SEALED_MAGIC:
        raise BadMagicError(f"not a sealed object: magic {magic!r}")
    if version not in SEALED_VERSIONS:
        raise UnsupportedError(f"sealed object version {version} not supported")
    at = SEALED_HEADER.size + block_size
    if at + 4 > view.nbytes:
        raise TruncatedError("sealed object ends inside its key block")
    cipher = open_cipher(object_key, bytes(view[SEALED_HEADER.size : at]), keks)
    (frame_size,) = struct.unpack_from(">I", view, at)
    if frame_size < 1:
        raise InvalidSizeError("sealed object frame size 0")
    at += 4
    header = bytes(view[: SEALED_HEADER.size if version == 1 else at])
    out = bytearray()
    step = frame_size + TAG_SIZE
    n = 0
    while True:
        piece = bytes(view[at : at + step])
        last = at + step >= view.nbytes
        out += cipher.open(n, last, piece, header)
        if last:
            return bytes(out)
        at += step
        n += 1
