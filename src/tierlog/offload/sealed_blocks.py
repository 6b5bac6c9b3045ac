"""Building the parts of a sealed (format 2) data object from a segment file.

A block of an encrypted stream's data object is a run of frames, one per chunk, each the
AES-256-GCM sealing of the chunk's 12-byte entry header and its bytes (see
``formats.offload_sealed``). The chunks of a block are contiguous in the segment file, so
they are read with the offloader's scatter read into a run of entries (header, chunk,
header, chunk, ...) and checked there, then each entry is sealed into the part buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tierlog.formats.encryption import AesGcmFrameCipher
from tierlog.formats.errors import InvalidSizeError
from tierlog.formats.offload import ENTRY_HEADER_SIZE, BlockPlan
from tierlog.formats.offload_sealed import SealedOffloadIndex

_ENTRY_HEADER = struct.Struct(">iq")

ReadEntries = Callable[[memoryview, list[tuple[int, int]], int], None]
"""``read(view, slots, first_entry)``: read (and check) chunks ``first_entry`` on into the
``[start, end)`` slots of ``view``."""


def seal_block(
    plan: BlockPlan,
    index: SealedOffloadIndex,
    cipher: AesGcmFrameCipher,
    read_entries: ReadEntries,
) -> bytearray:
    """The bytes of block ``plan`` (the data header first in block 1)."""
    meta = index.metadata
    lo, hi = plan.first_entry, plan.first_entry + plan.entry_count
    sizes: list[int] = meta.chunk_sizes()[lo:hi].tolist()
    ids: list[int] = meta.records["chunk_id"][lo:hi].tolist()
    run = bytearray(sum(sizes) + ENTRY_HEADER_SIZE * len(sizes))
    view = memoryview(run)
    slots: list[tuple[int, int]] = []
    pos = 0
    for size, chunk_id in zip(sizes, ids, strict=True):
        _ENTRY_HEADER.pack_into(view, pos, size, chunk_id)
        slots.append((pos + ENTRY_HEADER_SIZE, pos + ENTRY_HEADER_SIZE + size))
        pos += ENTRY_HEADER_SIZE + size
    read_entries(view, slots, lo)
    header = index.header
    last = meta.chunk_count - 1
    out = bytearray(plan.length)
    at = 0
    if plan.part_number == 1:
        out[: len(header)] = header
        at = len(header)
    for k, (start, end) in enumerate(slots):
        frame = cipher.seal(lo + k, lo + k == last, view[start - ENTRY_HEADER_SIZE : end], header)
        out[at : at + len(frame)] = frame
        at += len(frame)
    if at != plan.length:
        raise InvalidSizeError(f"block {plan.part_number}: sealed {at} of {plan.length} bytes")
    return out
