"""Encryption of stream objects: golden key block, round trips, and a typed error for every
attack on frames (reorder, drop, truncate, move between objects) and keys (wrong, rotated)."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.formats.test_fragment_v2 import realistic_chunks
from tierlog.errors import ConfigError
from tierlog.formats.encryption import (
    SEALED_HEADER,
    TAG_SIZE,
    key_block_kek_id,
    new_cipher,
    open_cipher,
    open_object,
    seal_object,
)
from tierlog.formats.errors import (
    AuthenticationError,
    FormatError,
    UnknownKeyError,
    UnsupportedError,
)
from tierlog.formats.fragment import TRAILER_SIZE, FragmentPlacement
from tierlog.formats.fragment_frames import (
    iter_chunks,
    validate_fragment,
)
from tierlog.formats.fragment_v2 import (
    CODEC_ZSTD,
    FragmentIndexV2,
    FrameCoding,
    decode_fragment,
    encode_fragment_v2,
)
from tierlog.remote.encryption import Keyring

KEK = bytes(range(32))
KEK2 = bytes(range(32, 64))
KEY = "tl/stream/__s_1/data/00000000000000000100.fragment"


def counter_random():
    state = {"n": 0}

    def rnd(n: int) -> bytes:
        out = bytes((state["n"] + i) % 256 for i in range(n))
        state["n"] += n
        return out

    return rnd


def test_golden_key_block() -> None:
    cipher = new_cipher(KEY, "k1", KEK, random=counter_random())
    block = cipher.key_block
    assert block[:4] == b"\x01\x02k1"
    assert block[4:16] == bytes(range(32, 44))  # the wrap nonce follows the data key draw
    assert len(block) == 2 + 2 + 12 + 48
    assert block.hex() == GOLDEN_KEY_BLOCK
    assert key_block_kek_id(block) == "k1"
    # The frame nonce is the frame number; the tag covers key, number and last flag.
    sealed = cipher.seal(0, True, b"hello")
    assert len(sealed) == 5 + TAG_SIZE
    assert open_cipher(KEY, block, {"k1": KEK}).open(0, True, sealed) == b"hello"


GOLDEN_KEY_BLOCK = (
    "01026b31202122232425262728292a2bd23ba473689d1c09127548c5cd15faf6c058fe8f939575f9"
    "74ef760955974016df6addb5ab8db17f97f13059a6f97406"
)


def test_frame_attacks_are_typed_errors() -> None:
    cipher = new_cipher(KEY, "k1", KEK)
    sealed = cipher.seal(3, False, b"payload")
    opened = open_cipher(KEY, cipher.key_block, {"k1": KEK})
    assert opened.open(3, False, sealed) == b"payload"
    with pytest.raises(AuthenticationError):
        opened.open(4, False, sealed)  # moved within the object
    with pytest.raises(AuthenticationError):
        opened.open(3, True, sealed)  # presented as the last frame
    with pytest.raises(AuthenticationError):
        opened.open(3, False, sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(AuthenticationError):  # key block moved to another object
        open_cipher(KEY.replace("100", "200"), cipher.key_block, {"k1": KEK})
    with pytest.raises(AuthenticationError):  # same id, another key
        open_cipher(KEY, cipher.key_block, {"k1": KEK2})
    with pytest.raises(UnknownKeyError):
        open_cipher(KEY, cipher.key_block, {"k2": KEK2})


def sealed_frames(data: bytes) -> tuple[bytes, list[bytes]]:
    block_size = struct.unpack_from(">H", data, 8)[0]
    at = SEALED_HEADER.size + block_size
    frame_size = struct.unpack_from(">I", data, at)[0]
    head, rest = data[: at + 4], data[at + 4 :]
    step = frame_size + TAG_SIZE
    return head, [rest[i : i + step] for i in range(0, len(rest), step)]


def test_sealed_object_round_trip_and_attacks() -> None:
    keys = {"k1": KEK}
    payload = bytes(range(256)) * 10
    data = seal_object(payload, new_cipher(KEY, "k1", KEK), frame_size=1000)
    assert open_object(data, KEY, keys) == payload
    head, frames = sealed_frames(data)
    assert len(frames) == 3
    with pytest.raises(AuthenticationError):  # reordered
        open_object(head + frames[1] + frames[0] + frames[2], KEY, keys)
    with pytest.raises(AuthenticationError):  # last frame dropped
        open_object(head + frames[0] + frames[1], KEY, keys)
    with pytest.raises(AuthenticationError):  # truncated inside the last frame
        open_object(data[:-5], KEY, keys)
    with pytest.raises(AuthenticationError):  # moved to another object
        open_object(data, KEY + ".copy", keys)
    other = seal_object(payload, new_cipher(KEY, "k1", KEK), frame_size=1000)
    _, other_frames = sealed_frames(other)
    with pytest.raises(AuthenticationError):  # a frame of another object of the same key
        open_object(head + other_frames[0] + frames[1] + frames[2], KEY, keys)
    for at in range(0, len(data), 37):
        damaged = bytearray(data)
        damaged[at] ^= 0x40
        with pytest.raises(FormatError):
            open_object(bytes(damaged), KEY, keys)
    assert open_object(seal_object(b"", new_cipher(KEY, "k1", KEK)), KEY, keys) == b""


@settings(max_examples=40, deadline=None)
@given(payload=st.binary(max_size=3000), frame_size=st.integers(1, 1500))
def test_sealed_object_property(payload: bytes, frame_size: int) -> None:
    data = seal_object(payload, new_cipher(KEY, "k1", KEK), frame_size=frame_size)
    assert open_object(data, KEY, {"k1": KEK}) == payload


def encrypted_fragment(keyring: Keyring, key: str = KEY, codec: int = CODEC_ZSTD):
    chunks, infos = realistic_chunks(6, 20)
    coding = FrameCoding(codec=codec, cipher=keyring.new_cipher(key))
    parts, _ = encode_fragment_v2(FragmentPlacement(0, 0, 0), chunks, infos, coding)
    return b"".join(parts), chunks


def test_encrypted_fragment_round_trip_and_rotation() -> None:
    old = Keyring([("k1", KEK)])
    data, chunks = encrypted_fragment(old)
    assert b"purchase" not in data and b"country" not in data
    with pytest.raises(UnsupportedError):
        decode_fragment(data)  # encrypted, no key
    index = validate_fragment(data, cipher_for=old.cipher_for(KEY))
    assert isinstance(index, FragmentIndexV2) and index.encrypted
    assert [bytes(c) for _, c in iter_chunks(data, index, None, old.cipher_for(KEY))] == chunks
    rotated = Keyring([("k2", KEK2), ("k1", KEK)])
    assert validate_fragment(data, cipher_for=rotated.cipher_for(KEY)).trailer == index.trailer
    new_data, _ = encrypted_fragment(rotated)
    assert key_block_kek_id(decode_fragment(new_data, rotated.cipher_for(KEY)).key_block) == "k2"
    with pytest.raises(UnknownKeyError):
        validate_fragment(new_data, cipher_for=old.cipher_for(KEY))
    with pytest.raises(AuthenticationError):  # the object copied under another key
        validate_fragment(data, cipher_for=old.cipher_for(KEY + "2"))


def recrc(data: bytearray) -> bytearray:
    """Recompute the trailer CRC as an attacker who changed the object would."""
    (index_start,) = struct.unpack_from(">Q", data, len(data) - TRAILER_SIZE + 56)
    body = data[index_start : len(data) - TRAILER_SIZE]
    crc = zlib.crc32(data[len(data) - TRAILER_SIZE : len(data) - 12], zlib.crc32(body))
    struct.pack_into(">I", data, len(data) - 12, crc)
    return data


def test_fragment_attacks_with_recomputed_crcs_are_authentication_errors() -> None:
    keyring = Keyring([("k1", KEK)])
    data, _ = encrypted_fragment(keyring)
    opener = keyring.cipher_for(KEY)
    # A trailer field changed (the seq no) and the CRC fixed up: the index frame's tag fails.
    forged = bytearray(data)
    at = len(forged) - TRAILER_SIZE + 76  # the sequence number
    struct.pack_into(">I", forged, at, 9)
    with pytest.raises(AuthenticationError):
        decode_fragment(bytes(recrc(forged)), opener)
    # Two frames swapped together with their index positions is beyond an attacker (the
    # index is sealed); swapping frame bytes of equal size trips frame CRCs or tags.
    index = decode_fragment(data, opener)
    p = index.records["position"].astype(int).tolist()
    s = index.records["stored_size"].astype(int).tolist()
    swapped = bytearray(data)
    a, b = bytes(data[p[0] : p[0] + s[0]]), bytes(data[p[1] : p[1] + s[1]])
    if len(a) == len(b):
        swapped[p[0] : p[0] + s[0]], swapped[p[1] : p[1] + s[1]] = b, a
        with pytest.raises(FormatError):
            validate_fragment(bytes(swapped), cipher_for=opener)
    # Every flipped byte is a typed error.
    for at in range(0, len(data), 11):
        damaged = bytearray(data)
        damaged[at] ^= 0x04
        with pytest.raises(FormatError):
            validate_fragment(bytes(damaged), cipher_for=opener)


def test_frame_of_another_encrypted_fragment_does_not_open() -> None:
    keyring = Keyring([("k1", KEK)])
    data, _ = encrypted_fragment(keyring)
    other, _ = encrypted_fragment(keyring)  # same key, fresh data key
    opener = keyring.cipher_for(KEY)
    index = decode_fragment(data, opener)
    from tierlog.formats.fragment_frames import FrameDecoder

    decoder = FrameDecoder(index, cipher_for=opener)
    p, s = int(index.records["position"][0]), int(index.records["stored_size"][0])
    foreign = other[p : p + s]
    assert decoder.decode(0, data[p : p + s])
    with pytest.raises(FormatError):
        decoder.decode(0, foreign)


def test_keyring_sources() -> None:
    line = "k1:" + base64.b64encode(KEK).decode()
    ring = Keyring.from_environment(
        {"TIERLOG_KEKS": line + ",k0:" + base64.b64encode(KEK2).decode()}
    )
    assert ring is not None and ring.current_id == "k1" and set(ring.keys) == {"k1", "k0"}
    assert Keyring.from_environment({}) is None
    with pytest.raises(ConfigError):
        Keyring.parse("k1:notbase64!!")
    with pytest.raises(ConfigError):
        Keyring.parse("k1:" + base64.b64encode(b"short").decode())
    with pytest.raises(ConfigError):
        Keyring.parse(line + "\n" + line)
    with pytest.raises(ConfigError):
        Keyring.parse("no-colon")
    with pytest.raises(ConfigError):
        Keyring.from_file("/nonexistent/keys")
    sealed = ring.seal("a/b", b"x" * 10)
    assert ring.open("a/b", sealed) == b"x" * 10
