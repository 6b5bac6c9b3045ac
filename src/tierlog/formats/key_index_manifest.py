"""The key-index manifest of one stream: which window files exist and what they cover.

Layout::

    "TLKM" u32 version 1, u64 writer epoch, u32 body size,
    u32 CRC-32 of the 20 header bytes before it and the body, body

The body is UTF-8 JSON ``{"stream_dir": str, "windows": [window, ...]}`` with windows in
start order, each ``{"start", "end", "slots", "items", "next_offset", "key_block",
"frame_size"}``: the window's time range ``[start, end)`` in ms, the file's slot and item
counts (which name it), the offset after the last record of the fragments the window was
built from (once the stream's first offset passes it, every record the window indexes is
past retention), and for a sealed file its key block (hex) and frame size (``""`` / 0 when
it is plaintext), and the record key it was built on (the stream's ``index_key`` then).
A lookup reads the manifest once per stream and then, per window, only
the file's ranges.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

MAGIC = b"TLKM"
VERSION = 1
HEADER = struct.Struct(">4sIQII")


@dataclass(frozen=True, slots=True)
class WindowEntry:
    start: int
    end: int
    slots: int
    items: int
    next_offset: int
    key_block: bytes = b""
    frame_size: int = 0
    key: str = "message-id"  # the stream's index_key when the window was built

    @property
    def sealed(self) -> bool:
        return bool(self.key_block)

    def to_json(self) -> dict[str, object]:
        return {
            "start": self.start,
            "end": self.end,
            "slots": self.slots,
            "items": self.items,
            "next_offset": self.next_offset,
            "key_block": self.key_block.hex(),
            "frame_size": self.frame_size,
            "key": self.key,
        }

    @staticmethod
    def from_json(data: object) -> WindowEntry:
        if not isinstance(data, dict):
            raise InvalidSizeError(f"key-index window is not an object: {data!r}")
        try:
            entry = WindowEntry(
                int(data["start"]),
                int(data["end"]),
                int(data["slots"]),
                int(data["items"]),
                int(data["next_offset"]),
                bytes.fromhex(str(data["key_block"])),
                int(data["frame_size"]),
                str(data.get("key", "message-id")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidSizeError(f"key-index window {data!r}: {exc}") from None
        if entry.end <= entry.start or entry.slots < 1 or entry.items < 0:
            raise InvalidSizeError(f"key-index window {data!r} is inconsistent")
        if entry.sealed != (entry.frame_size > 0):
            raise InvalidSizeError(f"key-index window {data!r}: key block and frame size")
        return entry


@dataclass(frozen=True, slots=True)
class KeyIndexManifest:
    stream_dir: str
    epoch: int
    windows: tuple[WindowEntry, ...] = ()

    def window(self, start: int) -> WindowEntry | None:
        for w in self.windows:
            if w.start == start:
                return w
        return None


def encode_manifest(manifest: KeyIndexManifest) -> bytes:
    windows = sorted(manifest.windows, key=lambda w: w.start)
    body = json.dumps(
        {"stream_dir": manifest.stream_dir, "windows": [w.to_json() for w in windows]},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    head = HEADER.pack(MAGIC, VERSION, manifest.epoch, len(body), 0)[:20]
    return head + struct.pack(">I", zlib.crc32(body, zlib.crc32(head))) + body


def decode_manifest(data: bytes | bytearray | memoryview) -> KeyIndexManifest:
    view = memoryview(data).cast("B")
    if view.nbytes < HEADER.size:
        raise TruncatedError(f"key-index manifest of {view.nbytes} bytes")
    magic, version, epoch, size, crc = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise BadMagicError(f"not a key-index manifest: magic {magic!r}")
    if version != VERSION:
        raise UnsupportedError(f"key-index manifest version {version} not supported")
    body = view[HEADER.size :]
    if body.nbytes != size:
        raise TruncatedError(f"key-index manifest body is {body.nbytes} bytes, not {size}")
    if zlib.crc32(body, zlib.crc32(view[:20])) != crc:
        raise CrcMismatchError("key-index manifest CRC mismatch")
    try:
        parsed = json.loads(bytes(body))
        stream_dir = str(parsed["stream_dir"])
        raw_windows = parsed["windows"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidSizeError(f"key-index manifest body: {exc}") from None
    if not isinstance(raw_windows, list):
        raise InvalidSizeError("key-index manifest windows is not a list")
    windows = tuple(WindowEntry.from_json(w) for w in raw_windows)
    starts = [w.start for w in windows]
    if starts != sorted(set(starts)):
        raise InvalidSizeError("key-index manifest windows out of order or repeated")
    return KeyIndexManifest(stream_dir, epoch, windows)
