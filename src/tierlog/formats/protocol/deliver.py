"""Deliver frames: a small prefix in front of raw Osiris chunk bytes.

On the wire a Deliver carries the 48-byte chunk header followed by the chunk's data
section only (RabbitMQ skips the bloom filter bytes and the trailer but leaves their
sizes in the header). The server sends ``deliver_prefix(...)`` and then the chunk
bytes straight from the segment file or a fetched fragment (sendfile / writelines),
so the chunk itself never passes through an encoder.
"""

import struct
from dataclasses import dataclass

from tierlog.formats.chunk import DATA_LENGTH_POS
from tierlog.formats.chunk import HEADER_SIZE as CHUNK_HEADER_SIZE
from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.errors import ProtocolError, TruncatedFrameError

_PREFIX_V1 = struct.Struct(">IHHB")
_PREFIX_V2 = struct.Struct(">IHHBQ")
_DATA_LENGTH = struct.Struct(">I")

DELIVER_V1_PREFIX_SIZE = _PREFIX_V1.size
DELIVER_V2_PREFIX_SIZE = _PREFIX_V2.size


def deliver_prefix(
    subscription_id: int, chunk_size: int, committed_chunk_id: int | None = None
) -> bytes:
    """Size, key, version, subscription id [, committed chunk id] of a Deliver frame.

    ``chunk_size`` is the number of chunk bytes that follow: 48 + the data length.
    Version 2 (with ``committed_chunk_id``) only for clients that negotiated it.
    """
    if committed_chunk_id is None:
        return _PREFIX_V1.pack(
            DELIVER_V1_PREFIX_SIZE - 4 + chunk_size, Command.DELIVER, 1, subscription_id
        )
    return _PREFIX_V2.pack(
        DELIVER_V2_PREFIX_SIZE - 4 + chunk_size,
        Command.DELIVER,
        2,
        subscription_id,
        committed_chunk_id,
    )


@dataclass(frozen=True, slots=True)
class Deliver:
    """A decoded Deliver frame (client side): the chunk header + data as sent."""

    subscription_id: int
    chunk: memoryview | bytes
    committed_chunk_id: int | None = None

    def encode(self) -> bytes:
        chunk = bytes(self.chunk)
        return deliver_prefix(self.subscription_id, len(chunk), self.committed_chunk_id) + chunk


def decode_deliver(body: memoryview | bytes) -> Deliver:
    """Decode a Deliver frame body; check the chunk's data length matches the frame."""
    view = body if isinstance(body, memoryview) else memoryview(body)
    if len(view) < 5:
        raise TruncatedFrameError("Deliver frame shorter than its header")
    version = struct.unpack_from(">H", view, 2)[0]
    subscription_id = view[4]
    committed: int | None = None
    start = 5
    if version == 2:
        if len(view) < 13:
            raise TruncatedFrameError("Deliver v2 frame shorter than its header")
        committed = struct.unpack_from(">Q", view, 5)[0]
        start = 13
    elif version != 1:
        raise ProtocolError(f"unsupported Deliver version {version}")
    chunk = view[start:]
    if len(chunk) < CHUNK_HEADER_SIZE:
        raise TruncatedFrameError("Deliver frame shorter than a chunk header")
    (data_length,) = _DATA_LENGTH.unpack_from(chunk, DATA_LENGTH_POS)
    if CHUNK_HEADER_SIZE + data_length != len(chunk):
        raise ProtocolError(
            f"Deliver chunk holds {len(chunk) - CHUNK_HEADER_SIZE} data bytes, "
            f"header says {data_length}"
        )
    return Deliver(subscription_id, chunk, committed)
